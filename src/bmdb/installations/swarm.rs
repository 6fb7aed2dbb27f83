//! Image swarms as the BMDB keeps them (`image_swarm_member`): the
//! machines installing one served image, each serving the others the
//! chunks it holds. A member joins when its installation starts and again
//! every [`REFRESH`]; one not seen for [`MEMBER_TTL`] is no longer listed
//! (its agent stopped, its machine rebooted).
//!
//! The members, in the order they joined, form a tree of fan-out
//! [`FAN_OUT`] (member `i`'s parent is member `(i - 1) / FAN_OUT`): each
//! asks its parent first, then the parent's parent, up to the first
//! member, which asks the image server. The image crosses the server's
//! link about once however many machines install it, and a member
//! uploads it at most `FAN_OUT` times. The view also counts the machines
//! asked to install the image that have not joined yet, for whom a member
//! alone serves on a while.

use std::time::Duration;

use uuid::Uuid;

use super::download::served_name;
use crate::bmdb::{BmdbError, Tx};

/// How often a member joins again to stay one.
pub const REFRESH: Duration = Duration::from_secs(10);
/// A member not seen for this long is no longer listed.
pub const MEMBER_TTL: Duration = Duration::from_secs(30);
/// Members one member serves, at most (besides those whose parent failed).
pub const FAN_OUT: usize = 4;

/// Another member as one member is to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwarmPeer {
    /// `host:port` of its chunk server.
    pub address: String,
    /// Its agent's ed25519 key (`machine_agent_started`).
    pub key: Vec<u8>,
}

/// The swarm as one member is to see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwarmView {
    /// Whom to ask for a chunk, nearest first: its ancestors in the tree.
    pub sources: Vec<SwarmPeer>,
    /// The keys of every member (whom it serves).
    pub member_keys: Vec<Vec<u8>>,
    /// Members listed.
    pub members: usize,
    /// Machines asked to install the image that have not joined (yet).
    pub awaited: usize,
}

const JOIN: &str = "INSERT INTO image_swarm_member (machine_id, image, address) \
     VALUES ($1, $2, $3) \
     ON CONFLICT (machine_id) DO UPDATE SET address = excluded.address, seen_at = now(), \
       image = excluded.image, left_at = NULL, \
       joined_at = CASE WHEN image_swarm_member.image = excluded.image \
         AND image_swarm_member.left_at IS NULL \
         AND image_swarm_member.seen_at > now() - make_interval(secs => $4) \
         THEN image_swarm_member.joined_at ELSE now() END";

const STAY: &str = "UPDATE image_swarm_member SET address = $3, seen_at = now() \
     WHERE machine_id = $1 AND image = $2 AND left_at IS NULL \
       AND seen_at > now() - make_interval(secs => $4)";

const MEMBERS: &str = "SELECT m.machine_id, m.address, a.agent_public_key \
     FROM image_swarm_member m JOIN machine_agent_started a USING (machine_id) \
     WHERE m.image = $1 AND m.left_at IS NULL \
       AND m.seen_at > now() - make_interval(secs => $2) \
     ORDER BY m.joined_at, m.machine_id";

/// The URLs of the pending installations whose image may be `image`
/// (their URL ends in `/images/<image>`) of machines that have not joined
/// its swarm since they were asked (those that joined and left, or
/// stopped, are not waited for): [`served_name`] says which are.
const AWAITED: &str = "SELECT i.image_url FROM machine_installation i \
     LEFT JOIN machine_os_installation_report r USING (machine_id) \
     WHERE (r.generation IS NULL OR r.generation < i.generation) \
       AND right(i.image_url, length($1) + 8) = '/images/' || $1 \
       AND NOT EXISTS (SELECT 1 FROM image_swarm_member m \
         WHERE m.machine_id = i.machine_id AND m.image = $1 \
           AND m.seen_at >= i.requested_at)";

/// Machine `machine_id`'s agent, serving chunks at `address`, is (still)
/// a member of image `image`'s swarm; how it is to see the swarm. A
/// member that left, or was not seen for [`MEMBER_TTL`], joins anew at the
/// end of the order. Unless `asked` (the machine has a pending
/// installation of the image), it may only stay a member: None when it
/// is none.
pub async fn join(
    tx: &mut Tx<'_>,
    machine_id: Uuid,
    image: &str,
    address: &str,
    asked: bool,
) -> Result<Option<SwarmView>, BmdbError> {
    let ttl = MEMBER_TTL.as_secs_f64();
    if asked {
        tx.execute(JOIN, &[&machine_id, &image, &address, &ttl])
            .await?;
    } else if tx
        .execute(STAY, &[&machine_id, &image, &address, &ttl])
        .await?
        == 0
    {
        return Ok(None);
    }
    let rows = tx.query(MEMBERS, &[&image, &ttl]).await?;
    let members: Vec<(Uuid, SwarmPeer)> = rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                SwarmPeer {
                    address: r.get(1),
                    key: r.get(2),
                },
            )
        })
        .collect();
    let awaited = tx
        .query(AWAITED, &[&image])
        .await?
        .iter()
        .filter(|r| served_name(r.get(0)) == Some(image))
        .count();
    let me = members.iter().position(|(id, _)| *id == machine_id);
    Ok(Some(SwarmView {
        sources: me
            .map(ancestors)
            .unwrap_or_default()
            .into_iter()
            .map(|i| members[i].1.clone())
            .collect(),
        member_keys: members.iter().map(|(_, p)| p.key.clone()).collect(),
        members: members.len(),
        awaited,
    }))
}

/// Machine `machine_id` serves image `image`'s chunks no more.
pub async fn leave(tx: &mut Tx<'_>, machine_id: Uuid, image: &str) -> Result<(), BmdbError> {
    tx.execute(
        "UPDATE image_swarm_member SET left_at = now() WHERE machine_id = $1 AND image = $2",
        &[&machine_id, &image],
    )
    .await?;
    Ok(())
}

/// Machine `machine_id` is about to be restarted (through its BMC): its
/// agent, and the chunk server with it, stops, so it is listed no more
/// (rather than until [`MEMBER_TTL`] passes: the members that ask it would
/// go to the image server meanwhile).
pub async fn restarting(tx: &mut Tx<'_>, machine_id: Uuid) -> Result<(), BmdbError> {
    tx.execute(
        "UPDATE image_swarm_member SET left_at = now() WHERE machine_id = $1 AND left_at IS NULL",
        &[&machine_id],
    )
    .await?;
    Ok(())
}

/// The ancestors of member `i` in the tree, its parent first.
pub fn ancestors(mut i: usize) -> Vec<usize> {
    let mut up = Vec::new();
    while i > 0 {
        i = (i - 1) / FAN_OUT;
        up.push(i);
    }
    up
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_member_asks_its_ancestors_parent_first_and_the_first_asks_the_server() {
        assert!(ancestors(0).is_empty());
        assert_eq!(ancestors(1), [0]);
        assert_eq!(ancestors(4), [0]);
        assert_eq!(ancestors(5), [1, 0]);
        assert_eq!(ancestors(21), [5, 1, 0]);
        // No member serves more than FAN_OUT children.
        let mut children = [0usize; 100];
        for i in 1..400 {
            children[ancestors(i)[0].min(99)] += 1;
        }
        assert!(children.iter().all(|&c| c <= FAN_OUT));
    }
}
