//! What the fleet page draws, as SVG written by the server: the declared
//! life cycle with each state's count (a state is a link that filters the
//! fleet), and takeovers, failures and recoveries over the last hours.

use std::time::Duration;

use maud::{Markup, html};

use crate::bmdb::lifecycle::TRANSITIONS;
use crate::bmdb::machines::MachineState;
use crate::bmdb::overview::Activity;

/// Where each state sits in the drawing: (column, row). Columns follow a
/// machine's life: taken in, managed, installed, below its system.
fn place(s: MachineState) -> (u32, u32) {
    use MachineState::*;
    match s {
        Unprovided => (0, 0),
        Discovered => (0, 1),
        Pending => (0, 2),
        Backoff => (0, 3),
        Leased => (0, 4),
        Enrolling => (1, 0),
        EnrollFailed => (1, 1),
        Inspecting => (1, 2),
        AgentStarted => (1, 3),
        RecoveryBackoff => (1, 4),
        Available => (2, 0),
        Held => (2, 1),
        Installing => (2, 2),
        InstallFailed => (2, 3),
        Installed => (2, 4),
        Cleaning => (3, 0),
        CleanFailed => (3, 1),
        Servicing => (3, 2),
        ServiceFailed => (3, 3),
    }
}

const BOX_W: f64 = 150.0;
const BOX_H: f64 = 40.0;
const COL: f64 = 200.0;
const ROW: f64 = 62.0;
const PAD: f64 = 8.0;

fn centre(s: MachineState) -> (f64, f64) {
    let (c, r) = place(s);
    (
        PAD + BOX_W / 2.0 + COL * f64::from(c),
        PAD + BOX_H / 2.0 + ROW * f64::from(r),
    )
}

/// The point where the segment from `a` to `b` leaves the box around `a`.
fn edge_of_box((ax, ay): (f64, f64), (bx, by): (f64, f64)) -> (f64, f64) {
    let (dx, dy) = (bx - ax, by - ay);
    let tx = if dx == 0.0 {
        f64::INFINITY
    } else {
        (BOX_W / 2.0 + 3.0) / dx.abs()
    };
    let ty = if dy == 0.0 {
        f64::INFINITY
    } else {
        (BOX_H / 2.0 + 3.0) / dy.abs()
    };
    let t = tx.min(ty);
    (ax + dx * t, ay + dy * t)
}

/// The declared life cycle (`bmdb::lifecycle::TRANSITIONS`), each state
/// with its count; `chosen` is the state the fleet is filtered by.
pub(super) fn life_cycle(
    counts: &[(MachineState, i64)],
    chosen: Option<MachineState>,
    link: &dyn Fn(MachineState) -> String,
) -> Markup {
    let count = |s: MachineState| counts.iter().find(|(c, _)| *c == s).map_or(0, |(_, n)| *n);
    let mut edges: Vec<(MachineState, MachineState)> = TRANSITIONS
        .iter()
        .filter(|(f, _, t)| f != t)
        .map(|(f, _, t)| (*f, *t))
        .collect();
    edges.sort_by_key(|(f, t)| (f.as_str(), t.as_str()));
    edges.dedup();
    let w = PAD * 2.0 + COL * 3.0 + BOX_W;
    let h = PAD * 2.0 + ROW * 4.0 + BOX_H;
    html! {
        svg.lifecycle #lifecycle width=(w) height=(h) viewBox={ "0 0 " (w) " " (h) }
            role="img" aria-label="the life cycle, each state with its machines" {
            defs {
                marker #arrow viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7"
                    orient="auto-start-reverse" {
                    path d="M0,0 L8,4 L0,8 z" fill="#999" {}
                }
            }
            @for (f, t) in &edges {
                @let (a, b) = (centre(*f), centre(*t));
                @let (x1, y1) = edge_of_box(a, b);
                @let (x2, y2) = edge_of_box(b, a);
                line.transition data-from=(f) data-to=(t)
                    x1=(format!("{x1:.1}")) y1=(format!("{y1:.1}"))
                    x2=(format!("{x2:.1}")) y2=(format!("{y2:.1}"))
                    stroke="#bbb" marker-end="url(#arrow)" {}
            }
            @for s in MachineState::ALL {
                @let (cx, cy) = centre(s);
                @let n = count(s);
                a href=(link(s)) {
                    g.state.empty[n == 0].chosen[chosen == Some(s)] data-state=(s) data-count=(n) {
                        title { (s) ": " (n) " machines; show them" }
                        rect x=(cx - BOX_W / 2.0) y=(cy - BOX_H / 2.0) width=(BOX_W) height=(BOX_H)
                            rx="6" fill=(if chosen == Some(s) { "#dbe8ff" } else if n == 0 { "#f7f7f7" } else { "#fff" })
                            stroke=(if n == 0 { "#ccc" } else { "#579" }) {}
                        text x=(cx) y=(cy - 3.0) text-anchor="middle" { (s) }
                        text.count id={ "count-" (s) } x=(cx) y=(cy + 13.0) text-anchor="middle" { (n) }
                    }
                }
            }
        }
    }
}

/// Takeovers, failures and recoveries per bucket: one row of bars per
/// series, each on its own scale (forty recoveries stay visible beside
/// two thousand takeovers), with hour marks below.
pub(super) fn activity(activity: &[Activity], bucket: Duration) -> Markup {
    const W: f64 = 640.0;
    const LEFT: f64 = 96.0;
    const ROW: f64 = 44.0;
    const GAP: f64 = 12.0;
    type Series = (&'static str, &'static str, fn(&Activity) -> i64);
    let series: [Series; 3] = [
        ("takeovers", "#2a7", |a| a.takeovers),
        ("failures", "#c33", |a| a.failures),
        ("recoveries", "#36c", |a| a.recoveries),
    ];
    let rows_h = series.len() as f64 * (ROW + GAP);
    let h = rows_h + 16.0;
    let n = activity.len().max(1) as f64;
    let step = (W - LEFT) / n;
    let x = |i: usize| LEFT + step * i as f64;
    let clock = |a: &Activity| humantime::format_rfc3339_seconds(a.start).to_string();
    let label = format!(
        "takeovers, failures and recoveries per {} over the last {}",
        humantime::format_duration(bucket),
        humantime::format_duration(bucket * activity.len() as u32)
    );
    html! {
        svg.chart #chart width=(W) height=(h) viewBox={ "0 0 " (W) " " (h) } role="img" aria-label=(label) {
            // A mark on every whole hour.
            @for (i, a) in activity.iter().enumerate() {
                @let t = clock(a);
                @if &t[14..19] == "00:00" {
                    line x1=(format!("{:.1}", x(i))) y1=(GAP) x2=(format!("{:.1}", x(i)))
                        y2=(format!("{rows_h:.0}")) stroke="#eee" {}
                    text x=(format!("{:.1}", x(i))) y=(format!("{:.0}", rows_h + 12.0))
                        text-anchor="middle" { (&t[11..16]) }
                }
            }
            @for (k, (name, color, value)) in series.iter().enumerate() {
                @let top = k as f64 * (ROW + GAP) + GAP;
                @let base = top + ROW;
                @let total: i64 = activity.iter().map(value).sum();
                @let max = activity.iter().map(value).max().unwrap_or(0);
                g.series data-series=(name) data-total=(total) {
                    text x="0" y=(format!("{:.0}", top + 14.0)) { (name) }
                    text.total x="0" y=(format!("{:.0}", top + 30.0)) { (total) " in all" }
                    text x=(format!("{:.0}", LEFT - 4.0)) y=(format!("{:.0}", top + 10.0))
                        text-anchor="end" { (max) }
                    line x1=(LEFT) y1=(base) x2=(W) y2=(base) stroke="#bbb" {}
                    @for (i, a) in activity.iter().enumerate() {
                        @let v = value(a);
                        @if v > 0 {
                            @let bar = (ROW * v as f64 / max.max(1) as f64).max(1.0);
                            rect x=(format!("{:.1}", x(i) + 0.5)) y=(format!("{:.1}", base - bar))
                                width=(format!("{:.1}", (step - 1.0).max(1.0)))
                                height=(format!("{bar:.1}")) fill=(color) {
                                title { (v) " " (name) " from " (&clock(a)[11..16]) }
                            }
                        }
                    }
                }
            }
        }
    }
}
