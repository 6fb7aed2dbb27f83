//! Projects' API tokens: made here, shown once, kept as their SHA-256
//! only; revoked at once; each use noted, to the minute.

use super::*;

/// A token as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TokenInfo {
    pub id: Uuid,
    pub project_id: Uuid,
    pub project: String,
    pub read_only: bool,
    pub description: Option<String>,
    #[serde(with = "humantime_serde")]
    pub created_at: SystemTime,
    pub created_by: String,
    #[serde(with = "humantime_serde")]
    pub revoked_at: Option<SystemTime>,
    #[serde(with = "humantime_serde")]
    pub last_used_at: Option<SystemTime>,
}

macro_rules! token_select {
    () => {
        "SELECT t.token_id, t.project_id, p.name, t.read_only, t.description, t.created_at, \
             t.created_by, t.revoked_at, t.last_used_at \
         FROM api_token t JOIN project p USING (project_id) "
    };
}

fn token_from(r: &tokio_postgres::Row) -> TokenInfo {
    TokenInfo {
        id: r.get(0),
        project_id: r.get(1),
        project: r.get(2),
        read_only: r.get(3),
        description: r.get(4),
        created_at: r.get(5),
        created_by: r.get(6),
        revoked_at: r.get(7),
        last_used_at: r.get(8),
    }
}

/// A new token's value: `shp_` and 40 letters and digits (about 238
/// random bits), so that secret scanners can tell it.
pub fn new_token_value() -> String {
    use rand::Rng as _;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let body: String = (0..40)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("shp_{body}")
}

/// What a token's value is kept as.
pub fn token_digest(value: &str) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(value.trim().as_bytes()).to_vec()
}

/// Makes a token of `project`: its record and its value (shown once, to
/// whoever asked; never logged).
pub async fn create_token(
    tx: &mut Tx<'_>,
    project_id: Uuid,
    read_only: bool,
    description: Option<&str>,
    actor: &str,
) -> Result<(TokenInfo, String), BmdbError> {
    let id = Uuid::new_v4();
    let value = new_token_value();
    tx.execute(
        "INSERT INTO api_token (token_id, project_id, read_only, description, token_sha256, \
             created_at, created_by) VALUES ($1, $2, $3, $4, $5, now(), $6)",
        &[
            &id,
            &project_id,
            &read_only,
            &description,
            &token_digest(&value),
            &actor,
        ],
    )
    .await?;
    let access = if read_only { "read-only" } else { "read-write" };
    audit(
        tx,
        actor,
        "token-create",
        Some(project_id),
        Some(id),
        None,
        &format!(
            "{access} token {id}{}",
            description.map(|d| format!(" ({d})")).unwrap_or_default()
        ),
    )
    .await?;
    let info = token_from(
        &tx.query_one(concat!(token_select!(), "WHERE t.token_id = $1"), &[&id])
            .await?,
    );
    Ok((info, value))
}

/// Every token (of one project, when given), newest last.
pub async fn tokens(tx: &mut Tx<'_>, project: Option<Uuid>) -> Result<Vec<TokenInfo>, BmdbError> {
    let sql = concat!(
        token_select!(),
        "WHERE $1::uuid IS NULL OR t.project_id = $1 ORDER BY t.created_at, t.token_id"
    );
    Ok(tx
        .query(sql, &[&project])
        .await?
        .iter()
        .map(token_from)
        .collect())
}

/// Revokes a token: every request with it is refused from the moment this
/// commits. False when there is no such token; a revoked token stays so.
pub async fn revoke_token(tx: &mut Tx<'_>, token_id: Uuid, actor: &str) -> Result<bool, BmdbError> {
    let Some(r) = tx
        .query_opt(
            "UPDATE api_token SET revoked_at = COALESCE(revoked_at, now()), \
                 revoked_by = COALESCE(revoked_by, $2) \
             WHERE token_id = $1 RETURNING project_id, revoked_by = $2 AND revoked_at = now()",
            &[&token_id, &actor],
        )
        .await?
    else {
        return Ok(false);
    };
    let (project, now): (Uuid, bool) = (r.get(0), r.get(1));
    if now {
        audit(
            tx,
            actor,
            "token-revoke",
            Some(project),
            Some(token_id),
            None,
            &format!("token {token_id} revoked"),
        )
        .await?;
    }
    Ok(true)
}

/// Whom a token acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHolder {
    pub token_id: Uuid,
    pub project_id: Uuid,
    pub read_only: bool,
}

/// The project a token value acts for, if it is a live token. Its use is
/// noted, to the minute.
pub async fn authenticate(tx: &mut Tx<'_>, value: &str) -> Result<Option<TokenHolder>, BmdbError> {
    let Some(r) = tx
        .query_opt(
            "SELECT token_id, project_id, read_only, \
                    last_used_at IS NULL OR last_used_at < now() - interval '1 minute' \
             FROM api_token WHERE token_sha256 = $1 AND revoked_at IS NULL",
            &[&token_digest(value)],
        )
        .await?
    else {
        return Ok(None);
    };
    let holder = TokenHolder {
        token_id: r.get(0),
        project_id: r.get(1),
        read_only: r.get(2),
    };
    if r.get::<_, bool>(3) {
        tx.execute(
            "UPDATE api_token SET last_used_at = now() WHERE token_id = $1",
            &[&holder.token_id],
        )
        .await?;
    }
    Ok(Some(holder))
}
