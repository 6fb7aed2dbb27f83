//! Whether a BMC answers IPMI over LAN at all: one sessionless Get Channel
//! Authentication Capabilities (IPMI 1.5 framing, no credentials), the
//! message every RMCP+ client sends before it opens a session, so every
//! IPMI 2.0 BMC answers it whatever sessions it holds. A console's reader
//! asks it while the console is silent, so that viewers are told within
//! seconds that its BMC went away, and when it is back.

use std::time::Duration;

use tokio::net::UdpSocket;

/// Why a ping got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PingError {
    #[error("BMC {host}:{port}: no address: {source}")]
    Resolve {
        host: String,
        port: u16,
        source: std::io::Error,
    },
    #[error("BMC {host}:{port}: {source}")]
    Io {
        host: String,
        port: u16,
        source: std::io::Error,
    },
    #[error("BMC {host}:{port}: no answer within {}", humantime::format_duration(*.timeout))]
    Silent {
        host: String,
        port: u16,
        timeout: Duration,
    },
}

/// The request: RMCP (version 6, no ACK, class IPMI), a session header
/// with no authentication, and the message to the BMC (address 0x20,
/// netfn App) asking channel 0x0E (this one) with IPMI 2.0 data for the
/// administrator's level. `seq` is the requester's sequence number.
fn request(seq: u8) -> [u8; 23] {
    let (rs, netfn, rq, rq_seq, cmd) = (0x20u8, 0x06u8 << 2, 0x81u8, seq << 2, 0x38u8);
    let data = [0x8e, 0x04];
    let sum1 = 0u8.wrapping_sub(rs.wrapping_add(netfn));
    let sum2 = 0u8.wrapping_sub(
        [rq, rq_seq, cmd, data[0], data[1]]
            .iter()
            .fold(0u8, |a, b| a.wrapping_add(*b)),
    );
    [
        0x06, 0x00, 0xff, 0x07, // RMCP
        0x00, 0, 0, 0, 0, 0, 0, 0, 0, 9, // session: none, seq 0, id 0, length
        rs, netfn, sum1, rq, rq_seq, cmd, data[0], data[1], sum2,
    ]
}

/// Whether `answer` is the BMC's to the request with `seq`: RMCP of class
/// IPMI, and a response (netfn App + 1) to the same command and sequence.
fn answers(answer: &[u8], seq: u8) -> bool {
    answer.len() >= 21
        && answer[0] == 0x06
        && answer[3] & 0x1f == 0x07
        && answer[15] >> 2 == 0x07
        && answer[18] >> 2 == seq & 0x3f
        && answer[19] == 0x38
}

/// One ping of the BMC at `target` (host, UDP port): Ok when it answered
/// within `timeout`.
pub async fn ping(target: &(String, u16), timeout: Duration) -> Result<(), PingError> {
    let (host, port) = (
        target.0.trim_start_matches('[').trim_end_matches(']'),
        target.1,
    );
    let named = |source| PingError::Io {
        host: host.to_string(),
        port,
        source,
    };
    let addr = tokio::net::lookup_host((host, port))
        .await
        .and_then(|mut a| {
            a.next()
                .ok_or_else(|| std::io::Error::other("the name resolves to no address"))
        })
        .map_err(|source| PingError::Resolve {
            host: host.to_string(),
            port,
            source,
        })?;
    let local = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(local).await.map_err(named)?;
    socket.connect(addr).await.map_err(named)?;
    let seq = rand::random::<u8>() & 0x3f;
    let wait = async {
        socket.send(&request(seq)).await?;
        let mut buf = [0u8; 512];
        loop {
            let n = socket.recv(&mut buf).await?;
            if answers(&buf[..n], seq) {
                return Ok::<(), std::io::Error>(());
            }
        }
    };
    match tokio::time::timeout(timeout, wait).await {
        Ok(r) => r.map_err(named),
        Err(_) => Err(PingError::Silent {
            host: host.to_string(),
            port,
            timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_s_checksums_hold() {
        let r = request(5);
        assert_eq!(r[14].wrapping_add(r[15]).wrapping_add(r[16]), 0);
        assert_eq!(r[17..].iter().fold(0u8, |a, b| a.wrapping_add(*b)), 0);
        assert_eq!(r[13] as usize, r.len() - 14);
    }
}
