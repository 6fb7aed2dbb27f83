//! Projects' SSH keys: checked, fingerprinted, given to their devices.

use super::*;

/// A project's SSH key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshKey {
    pub id: Uuid,
    pub project_id: Uuid,
    pub label: String,
    pub key: String,
    pub fingerprint: String,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
}

macro_rules! key_columns {
    () => {
        "key_id, project_id, label, key, fingerprint, created_at, updated_at"
    };
}

fn key_from(r: &tokio_postgres::Row) -> SshKey {
    SshKey {
        id: r.get(0),
        project_id: r.get(1),
        label: r.get(2),
        key: r.get(3),
        fingerprint: r.get(4),
        created_at: r.get(5),
        updated_at: r.get(6),
    }
}

/// A public key in OpenSSH's one-line form, checked, and its SHA-256
/// fingerprint; the error says what is wrong (never echoing the key).
pub fn parse_public_key(line: &str) -> Result<(String, String), String> {
    let line = line.trim();
    let key = russh::keys::PublicKey::from_openssh(line)
        .map_err(|e| format!("not an OpenSSH public key ({e})"))?;
    let fingerprint = key.fingerprint(russh::keys::HashAlg::Sha256).to_string();
    Ok((line.to_string(), fingerprint))
}

/// Every key of one project, or of every project (None), oldest first.
pub async fn keys(tx: &mut Tx<'_>, project: Option<Uuid>) -> Result<Vec<SshKey>, BmdbError> {
    Ok(tx
        .query(
            concat!(
                "SELECT ",
                key_columns!(),
                " FROM project_ssh_key \
                 WHERE $1::uuid IS NULL OR project_id = $1 ORDER BY created_at, key_id"
            ),
            &[&project],
        )
        .await?
        .iter()
        .map(key_from)
        .collect())
}

pub async fn key(tx: &mut Tx<'_>, id: Uuid) -> Result<Option<SshKey>, BmdbError> {
    Ok(tx
        .query_opt(
            concat!(
                "SELECT ",
                key_columns!(),
                " FROM project_ssh_key WHERE key_id = $1"
            ),
            &[&id],
        )
        .await?
        .as_ref()
        .map(key_from))
}

/// Adds a key to a project; Err when the project has it already.
pub async fn add_key(
    tx: &mut Tx<'_>,
    project: Uuid,
    label: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Result<SshKey, String>, BmdbError> {
    let id = Uuid::new_v4();
    let row = tx
        .query_opt(
            concat!(
                "INSERT INTO project_ssh_key (key_id, project_id, label, key, fingerprint, \
                     created_at, updated_at) VALUES ($1, $2, $3, $4, $5, now(), now()) \
                 ON CONFLICT (project_id, fingerprint) DO NOTHING RETURNING ",
                key_columns!()
            ),
            &[&id, &project, &label, &key, &fingerprint],
        )
        .await?;
    Ok(row
        .as_ref()
        .map(key_from)
        .ok_or_else(|| format!("the project has this key already ({fingerprint})")))
}

/// Changes a key's label or the key itself.
pub async fn update_key(
    tx: &mut Tx<'_>,
    id: Uuid,
    label: Option<&str>,
    key: Option<(&str, &str)>,
) -> Result<Option<SshKey>, BmdbError> {
    let (k, f) = key.unzip();
    Ok(tx
        .query_opt(
            concat!(
                "UPDATE project_ssh_key SET label = COALESCE($2, label), key = COALESCE($3, key), \
                     fingerprint = COALESCE($4, fingerprint), updated_at = now() \
                 WHERE key_id = $1 RETURNING ",
                key_columns!()
            ),
            &[&id, &label, &k, &f],
        )
        .await?
        .as_ref()
        .map(key_from))
}

pub async fn delete_key(tx: &mut Tx<'_>, id: Uuid) -> Result<bool, BmdbError> {
    Ok(tx
        .execute("DELETE FROM project_ssh_key WHERE key_id = $1", &[&id])
        .await?
        > 0)
}
