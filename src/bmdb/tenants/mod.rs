//! Tenants: projects and the machines operators assign them (CONTRACTS.md
//! §7); every change is in `tenant_audit`. By job, beside this file:
//!
//! - `tokens.rs`: their API tokens (made here, shown once, kept as their
//!   SHA-256 only);
//! - `keys.rs`: their SSH keys.

use std::time::SystemTime;

use uuid::Uuid;

use super::{BmdbError, Tx};

mod keys;
pub mod networks;
mod tokens;

pub use keys::*;
pub use tokens::*;

/// A project, as the operator's side lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Project {
    pub id: Uuid,
    pub name: String,
    #[serde(with = "humantime_serde")]
    pub created_at: SystemTime,
    pub created_by: String,
    pub max_devices: Option<i32>,
    pub shared_pool: bool,
    /// Machines assigned to it.
    pub machines: i64,
    /// Its devices now (not deleted).
    pub devices: i64,
    /// Those devices' IDs, oldest first.
    pub device_ids: Vec<Uuid>,
    /// Its SSH keys' IDs, oldest first.
    pub key_ids: Vec<Uuid>,
}

macro_rules! project_select {
    () => {
        "SELECT p.project_id, p.name, p.created_at, p.created_by, p.max_devices, p.shared_pool, \
             (SELECT count(*) FROM machine_project mp WHERE mp.project_id = p.project_id), \
             (SELECT count(*) FROM device d WHERE d.project_id = p.project_id \
               AND d.deleted_at IS NULL), \
             ARRAY(SELECT d.device_id FROM device d WHERE d.project_id = p.project_id \
               AND d.deleted_at IS NULL ORDER BY d.created_at, d.device_id), \
             ARRAY(SELECT k.key_id FROM project_ssh_key k WHERE k.project_id = p.project_id \
               ORDER BY k.created_at, k.key_id) \
         FROM project p "
    };
}

fn project_from(r: &tokio_postgres::Row) -> Project {
    Project {
        id: r.get(0),
        name: r.get(1),
        created_at: r.get(2),
        created_by: r.get(3),
        max_devices: r.get(4),
        shared_pool: r.get(5),
        machines: r.get(6),
        devices: r.get(7),
        device_ids: r.get(8),
        key_ids: r.get(9),
    }
}

const AUDIT: &str = "INSERT INTO tenant_audit \
         (tenant_audit_id, \"timestamp\", actor, action, project_id, token_id, machine_id, detail) \
     VALUES ($1, now(), $2, $3, $4, $5, $6, $7)";

async fn audit(
    tx: &mut Tx<'_>,
    actor: &str,
    action: &str,
    project: Option<Uuid>,
    token: Option<Uuid>,
    machine: Option<Uuid>,
    detail: &str,
) -> Result<(), BmdbError> {
    tx.execute(
        AUDIT,
        &[
            &Uuid::new_v4(),
            &actor,
            &action,
            &project,
            &token,
            &machine,
            &detail,
        ],
    )
    .await?;
    Ok(())
}

/// A project's name is 1 to 80 printable characters.
pub fn check_project_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() || name.chars().count() > 80 || name.chars().any(char::is_control) {
        return Err(format!(
            "project name {name:?}: 1 to 80 printable characters"
        ));
    }
    Ok(())
}

/// Makes a project; refused (Err) when the name is taken.
pub async fn create_project(
    tx: &mut Tx<'_>,
    name: &str,
    actor: &str,
    max_devices: Option<i32>,
    shared_pool: bool,
) -> Result<Result<Project, String>, BmdbError> {
    check_project_name(name).map_err(BmdbError::Invalid)?;
    let id = Uuid::new_v4();
    let n = tx
        .execute(
            "INSERT INTO project (project_id, name, created_at, created_by, max_devices, shared_pool) \
             VALUES ($1, $2, now(), $3, $4, $5) ON CONFLICT (name) DO NOTHING",
            &[&id, &name, &actor, &max_devices, &shared_pool],
        )
        .await?;
    if n == 0 {
        return Ok(Err(format!("a project named {name:?} exists already")));
    }
    let limit = max_devices.map_or("no device limit".to_string(), |m| {
        format!("at most {m} devices")
    });
    let pool = if shared_pool {
        "draws from the shared pool"
    } else {
        "assigned machines only"
    };
    audit(
        tx,
        actor,
        "project-create",
        Some(id),
        None,
        None,
        &format!("project {name:?}: {limit}, {pool}"),
    )
    .await?;
    Ok(Ok(project(tx, id).await?.expect("inserted above")))
}

/// Every project, by name.
pub async fn projects(tx: &mut Tx<'_>) -> Result<Vec<Project>, BmdbError> {
    let sql = concat!(project_select!(), "ORDER BY p.name");
    Ok(tx.query(sql, &[]).await?.iter().map(project_from).collect())
}

/// Every project's ID and name, by name (no counts: the fleet page's
/// project filter, read whatever the fleet's size).
pub async fn project_names(tx: &mut Tx<'_>) -> Result<Vec<(Uuid, String)>, BmdbError> {
    Ok(tx
        .query("SELECT project_id, name FROM project ORDER BY name", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

pub async fn project(tx: &mut Tx<'_>, id: Uuid) -> Result<Option<Project>, BmdbError> {
    let sql = concat!(project_select!(), "WHERE p.project_id = $1");
    Ok(tx.query_opt(sql, &[&id]).await?.as_ref().map(project_from))
}

/// A project by its ID or, failing that, its name.
pub async fn find_project(tx: &mut Tx<'_>, id_or_name: &str) -> Result<Option<Project>, BmdbError> {
    if let Ok(id) = id_or_name.trim().parse::<Uuid>()
        && let Some(p) = project(tx, id).await?
    {
        return Ok(Some(p));
    }
    let sql = concat!(project_select!(), "WHERE p.name = $1");
    Ok(tx
        .query_opt(sql, &[&id_or_name.trim()])
        .await?
        .as_ref()
        .map(project_from))
}

/// Sets a project's device limit (None: none) and whether it draws from
/// the shared pool.
pub async fn set_limits(
    tx: &mut Tx<'_>,
    project_id: Uuid,
    max_devices: Option<i32>,
    shared_pool: bool,
    actor: &str,
) -> Result<bool, BmdbError> {
    let n = tx
        .execute(
            "UPDATE project SET max_devices = $2, shared_pool = $3 WHERE project_id = $1",
            &[&project_id, &max_devices, &shared_pool],
        )
        .await?;
    if n > 0 {
        let limit = max_devices.map_or("no device limit".to_string(), |m| {
            format!("at most {m} devices")
        });
        audit(
            tx,
            actor,
            "project-limit",
            Some(project_id),
            None,
            None,
            &format!(
                "{limit}; {}",
                if shared_pool {
                    "draws from the shared pool"
                } else {
                    "assigned machines only"
                }
            ),
        )
        .await?;
    }
    Ok(n > 0)
}

/// How assigning one machine ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assigned {
    Done(String),
    /// Not changed, and why.
    Refused(String),
    NotFound,
}

/// Locks the machine's row; false when there is no such machine.
async fn lock_machine(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<bool, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT 1 FROM machines WHERE machine_id = $1 FOR UPDATE",
            &[&machine_id],
        )
        .await?
        .is_some())
}

/// The device running on the machine (of a project other than `except`):
/// its ID and its project's name.
async fn device_on(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    except: Option<Uuid>,
) -> Result<Option<(Uuid, String)>, BmdbError> {
    Ok(tx
        .query_opt(
            "SELECT d.device_id, p.name FROM device d JOIN project p USING (project_id) \
             WHERE d.machine_id = $1 AND d.deleted_at IS NULL \
               AND ($2::uuid IS NULL OR d.project_id <> $2)",
            &[&machine_id, &except],
        )
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

/// Assigns `machine` to `project` (its hardware reservation there).
/// Refused while another project's device runs on it: reclaim that first.
pub async fn assign(
    tx: &mut Tx<'_>,
    project_id: Uuid,
    machine_id: Uuid,
    actor: &str,
) -> Result<Assigned, BmdbError> {
    if !lock_machine(tx, machine_id).await? {
        return Ok(Assigned::NotFound);
    }
    if let Some((device, name)) = device_on(tx, machine_id, Some(project_id)).await? {
        return Ok(Assigned::Refused(format!(
            "machine {machine_id} runs device {device} of project {name:?}: reclaim it first"
        )));
    }
    let before: Option<Uuid> = tx
        .query_opt(
            "SELECT project_id FROM machine_project WHERE machine_id = $1",
            &[&machine_id],
        )
        .await?
        .map(|r| r.get(0));
    if before == Some(project_id) {
        return Ok(Assigned::Done(format!(
            "machine {machine_id} was assigned to this project already"
        )));
    }
    tx.execute(
        "INSERT INTO machine_project (machine_id, project_id, assigned_at, assigned_by) \
         VALUES ($1, $2, now(), $3) ON CONFLICT (machine_id) DO UPDATE SET \
         project_id = EXCLUDED.project_id, assigned_at = EXCLUDED.assigned_at, \
         assigned_by = EXCLUDED.assigned_by",
        &[&machine_id, &project_id, &actor],
    )
    .await?;
    let detail = match before {
        Some(b) => format!("machine {machine_id} moved from project {b}"),
        None => format!("machine {machine_id} assigned"),
    };
    audit(
        tx,
        actor,
        "assign",
        Some(project_id),
        None,
        Some(machine_id),
        &detail,
    )
    .await?;
    Ok(Assigned::Done(detail))
}

/// Gives `machine` back to the shared pool. Refused while a device runs
/// on it: reclaim it first.
pub async fn unassign(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    actor: &str,
) -> Result<Assigned, BmdbError> {
    if !lock_machine(tx, machine_id).await? {
        return Ok(Assigned::NotFound);
    }
    if let Some((device, name)) = device_on(tx, machine_id, None).await? {
        return Ok(Assigned::Refused(format!(
            "machine {machine_id} runs device {device} of project {name:?}: reclaim it first"
        )));
    }
    let Some(r) = tx
        .query_opt(
            "DELETE FROM machine_project WHERE machine_id = $1 RETURNING project_id",
            &[&machine_id],
        )
        .await?
    else {
        return Ok(Assigned::Done(format!(
            "machine {machine_id} was in the shared pool already"
        )));
    };
    let project: Uuid = r.get(0);
    let detail = format!("machine {machine_id} back to the shared pool");
    audit(
        tx,
        actor,
        "unassign",
        Some(project),
        None,
        Some(machine_id),
        &detail,
    )
    .await?;
    Ok(Assigned::Done(detail))
}
