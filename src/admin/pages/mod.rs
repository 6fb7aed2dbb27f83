//! The server-rendered pages, by job beside this file:
//!
//! - `fleet.rs`: the fleet (the life cycle drawn with its counts, filters,
//!   search, paging, sessions, loops, endpoints, the provisioner and the
//!   Equinix request budget) and the brake's release form;
//! - `machines.rs`: the fleet page's machines (filters, paging, the table
//!   and the bulk actions' selection);
//! - `bulk.rs`: a bulk action's confirmation and its outcome, machine by
//!   machine;
//! - `machine.rs`: a page per machine with its history, its audit and the
//!   operators' buttons;
//! - `charts.rs`: what the fleet page draws (SVG): the life cycle and the
//!   activity of the last hours;
//! - `parts.rs`: what every page shares (times, options, the CSRF field).
//!
//! Written with maud (`super::html`): every value is escaped as it is
//! spliced in. Plain HTML and SVG; the pages work without JavaScript.

mod bulk;
mod charts;
mod fleet;
mod machine;
mod machines;
mod parts;

pub(super) use bulk::{bulk_form, bulk_page};
pub(super) use fleet::{brake_form, fleet_page};
pub(super) use machine::{console_download, form_action, machine_page};
pub(super) use parts::{csrf_field, req_operator};
