//! The takeover protocol (shared/CONTRACTS.md §1): the message shepherd
//! sends on the agent's stdin, and the one place the agent's reply is
//! judged.

use crate::api::{TakeoverInit, TakeoverResponse, takeover_response};
use prost::Message;

/// The public key length an agent must reply with (ed25519).
pub const AGENT_KEY_LEN: usize = 32;

/// Why a reply is not a successful takeover. Messages are for operators.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    #[error("agent replied nothing")]
    Empty,
    #[error("agent reply is not a TakeoverResponse ({0})")]
    Undecodable(String),
    #[error("agent reported an error: {0}")]
    Agent(String),
    #[error("agent reply has neither success nor error")]
    NoResult,
    #[error("agent did not echo the init message it was sent")]
    WrongEcho,
    #[error("agent reply has a {0}-byte key, not {AGENT_KEY_LEN}")]
    KeyLength(usize),
}

/// The message sent on the agent's stdin.
pub fn init_message(
    machine_id: uuid::Uuid,
    endpoint: &str,
    ca_certificate: Option<&[u8]>,
) -> TakeoverInit {
    TakeoverInit {
        machine_id: machine_id.hyphenated().to_string(),
        bmaas_endpoint: endpoint.to_string(),
        ca_certificate: ca_certificate.map(<[u8]>::to_vec).unwrap_or_default(),
    }
}

/// A successful takeover: the agent's public key and its warnings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Takeover {
    pub key: [u8; AGENT_KEY_LEN],
    pub warnings: Vec<String>,
}

/// Accepts only a `success` echoing `sent` exactly, with a 32-byte key.
pub fn check_reply(sent: &TakeoverInit, stdout: &[u8]) -> Result<Takeover, ReplyError> {
    if stdout.is_empty() {
        return Err(ReplyError::Empty);
    }
    let reply =
        TakeoverResponse::decode(stdout).map_err(|e| ReplyError::Undecodable(e.to_string()))?;
    match reply.result {
        None => Err(ReplyError::NoResult),
        Some(takeover_response::Result::Error(e)) => Err(ReplyError::Agent(e.message)),
        Some(takeover_response::Result::Success(s)) => {
            if s.init_message.as_ref() != Some(sent) {
                return Err(ReplyError::WrongEcho);
            }
            let key: [u8; AGENT_KEY_LEN] = s
                .key
                .as_slice()
                .try_into()
                .map_err(|_| ReplyError::KeyLength(s.key.len()))?;
            Ok(Takeover {
                key,
                warnings: s.warning,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::*;

    fn sent() -> TakeoverInit {
        init_message(uuid::Uuid::nil(), "bmaas.example:443", None)
    }

    fn reply(r: takeover_response::Result) -> Vec<u8> {
        TakeoverResponse { result: Some(r) }.encode_to_vec()
    }

    #[test]
    fn only_an_exact_echo_with_a_32_byte_key_is_accepted() {
        let ok = reply(takeover_response::Result::Success(TakeoverSuccess {
            init_message: Some(sent()),
            key: vec![7; 32],
            warning: vec!["no TPM".into()],
        }));
        let t = check_reply(&sent(), &ok).unwrap();
        assert_eq!(t.key, [7; 32]);
        assert_eq!(t.warnings, vec!["no TPM".to_string()]);

        let mut other = sent();
        other.bmaas_endpoint.push('x');
        let wrong = reply(takeover_response::Result::Success(TakeoverSuccess {
            init_message: Some(other),
            key: vec![7; 32],
            warning: vec![],
        }));
        assert_eq!(check_reply(&sent(), &wrong), Err(ReplyError::WrongEcho));
        let short = reply(takeover_response::Result::Success(TakeoverSuccess {
            init_message: Some(sent()),
            key: vec![7; 31],
            warning: vec![],
        }));
        assert_eq!(check_reply(&sent(), &short), Err(ReplyError::KeyLength(31)));
        let err = reply(takeover_response::Result::Error(TakeoverError {
            message: "disk on fire".into(),
        }));
        assert_eq!(
            check_reply(&sent(), &err),
            Err(ReplyError::Agent("disk on fire".into()))
        );
        assert_eq!(check_reply(&sent(), b""), Err(ReplyError::Empty));
        assert!(matches!(
            check_reply(&sent(), b"\xff\xff\xff"),
            Err(ReplyError::Undecodable(_))
        ));
        assert_eq!(
            check_reply(
                &sent(),
                &TakeoverResponse { result: None }.encode_to_vec()[..]
            ),
            Err(ReplyError::Empty)
        );
    }

    #[test]
    fn field_numbers_are_the_contract() {
        // machine_id = 1 (string "a"), bmaas_endpoint = 2, ca_certificate = 3.
        let m = TakeoverInit {
            machine_id: "a".into(),
            bmaas_endpoint: "b".into(),
            ca_certificate: vec![1],
        };
        assert_eq!(
            m.encode_to_vec(),
            vec![0x0a, 1, b'a', 0x12, 1, b'b', 0x1a, 1, 1]
        );
        // TakeoverResponse.error = 2 { message = 1 }.
        let r = TakeoverResponse {
            result: Some(takeover_response::Result::Error(TakeoverError {
                message: "x".into(),
            })),
        };
        assert_eq!(r.encode_to_vec(), vec![0x12, 3, 0x0a, 1, b'x']);
    }
}
