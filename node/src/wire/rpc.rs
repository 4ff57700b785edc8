//! Service tags on the node's single request-response protocol (`/iota/rr/1.0.0`).
//!
//! A node speaks one request-response protocol, shared by every service that asks a peer
//! for bytes (butterfly merges, and later activations and weight fetches). The first byte
//! of every request and of every response names the service; the rest is that service's
//! own message. Guarantees: [`split`] and [`open_response`] never panic and never copy;
//! a request whose tag no service claims gets an [`ErrorCode::UnknownService`] response
//! ([`fallback_response`]), never silence and never a panic.
//!
//! # Tag table
//!
//! | tag | service | request | response |
//! | --- | --- | --- | --- |
//! | `0x00` | error (responses only) | — | `0x00, code` ([`ErrorCode`]) |
//! | `0x01` | butterfly merge ([`super`]) | `0x01, butterfly::Request` | `0x01, butterfly::Response` |
//! | `0x02` | pipeline forward ([`crate::services::miner`]) | `0x02, header, activation frame` | `0x02, header, gradient frame` |
//! | `0x03` | pipeline evaluation | `0x03, header, activation frame` | `0x03, header` |
//! | `0x04` | stage weights for a joining replica | `0x04, header` | `0x04, header, f32 weights` |
//! | `0x05` | spot check by a validator | `0x05, header` | `0x05, header, input frame, output frame, f32 weights` |
//! | `0x06` | a validator's word on a merge it audited | `0x06, header` | `0x06, header` |
//! | `0x07` | the run's data: manifest, tokenizer, shard chunks ([`crate::services::data`]) | `0x07, header` | `0x07, header, bytes` |
//! | `0x08` | joining a run: its name and hashes, its configuration and stake snapshot by hash ([`crate::join`]) | `0x08, header` | `0x08, header, bytes` |
//! | `0x09`–`0xEF` | free: add a row and a constant here before using one | | |
//! | `0xF0`–`0xFF` | experiments, tests and benchmarks; a node never sends them and answers them with `UnknownService` | | |
//!
//! A service answers a request it cannot parse with [`ErrorCode::Malformed`], and answers
//! "I have nothing for that" inside its own response format (as the butterfly's
//! `Response::Unavailable` does), so that the error tag stays for protocol-level failures.

use std::ops::RangeInclusive;

/// Tag of an error response.
pub const ERROR: u8 = 0x00;
/// Tag of the butterfly merge service.
pub const BUTTERFLY: u8 = 0x01;
/// Tag of the pipeline's forward service (activation in, gradient back).
pub const PIPELINE_FORWARD: u8 = 0x02;
/// Tag of the pipeline's held-out evaluation service.
pub const PIPELINE_EVAL: u8 = 0x03;
/// Tag of the service that hands a stage's weights to a joining replica.
pub const STAGE_WEIGHTS: u8 = 0x04;
/// Tag of the service that shows a validator the evidence of one recent sample.
pub const SPOT_CHECK: u8 = 0x05;
/// Tag of the service that tells a joining replica which merge hash a validator's audit
/// confirmed.
pub const MERGE_CONFIRMATION: u8 = 0x06;
/// Tag of the data service (manifests, tokenizers and shard chunks by hash).
pub const DATA: u8 = 0x07;
/// Tag of the join service (a run's name, configuration and stake snapshot, by hash).
pub const JOIN: u8 = 0x08;
/// Tags reserved for experiments, tests and benchmarks.
pub const EXPERIMENTAL: RangeInclusive<u8> = 0xF0..=0xFF;

/// Why a request was refused, carried as the second byte of an error response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// No service of this node answers to the request's tag.
    UnknownService,
    /// The request was empty, or its service could not parse it.
    Malformed,
    /// The sender may not make this request now (see the router's rules).
    Refused,
    /// The sender, or all senders together, have too many requests in progress.
    Busy,
}

impl ErrorCode {
    /// The wire byte.
    pub fn byte(self) -> u8 {
        match self {
            ErrorCode::UnknownService => 1,
            ErrorCode::Malformed => 2,
            ErrorCode::Refused => 3,
            ErrorCode::Busy => 4,
        }
    }

    /// The code a wire byte stands for, if it is known.
    pub fn from_byte(byte: u8) -> Option<ErrorCode> {
        match byte {
            1 => Some(ErrorCode::UnknownService),
            2 => Some(ErrorCode::Malformed),
            3 => Some(ErrorCode::Refused),
            4 => Some(ErrorCode::Busy),
            _ => None,
        }
    }
}

/// Why a frame has no service tag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame has no bytes at all.
    #[error("empty frame: no service tag")]
    Empty,
}

/// Why a response is not the answer of the expected service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// The response has no bytes at all.
    #[error("empty response: no service tag")]
    Empty,
    /// The peer answered with an error response; carries the code byte (0 if missing).
    #[error("peer refused the request (error code {0})")]
    Refused(u8),
    /// The response carries another service's tag.
    #[error("response tagged {got:#04x}, expected {expected:#04x}")]
    WrongService {
        /// The tag asked for.
        expected: u8,
        /// The tag received.
        got: u8,
    },
}

impl ResponseError {
    /// The error code of a [`ResponseError::Refused`], if it is a known one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ResponseError::Refused(byte) => ErrorCode::from_byte(*byte),
            _ => None,
        }
    }
}

/// `payload` behind the service tag `tag`.
pub fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + payload.len());
    out.push(tag);
    out.extend_from_slice(payload);
    out
}

/// The service tag of a request or response and the service's bytes.
pub fn split(frame: &[u8]) -> Result<(u8, &[u8]), FrameError> {
    match frame.split_first() {
        Some((tag, rest)) => Ok((*tag, rest)),
        None => Err(FrameError::Empty),
    }
}

/// An error response with `code`.
pub fn error_response(code: ErrorCode) -> Vec<u8> {
    vec![ERROR, code.byte()]
}

/// The response to a request that no service of this node claimed: `Malformed` for an
/// empty request, `UnknownService` otherwise.
pub fn fallback_response(request: &[u8]) -> Vec<u8> {
    match split(request) {
        Ok(_) => error_response(ErrorCode::UnknownService),
        Err(FrameError::Empty) => error_response(ErrorCode::Malformed),
    }
}

/// The service bytes of a response that should come from service `expected`.
pub fn open_response(response: &[u8], expected: u8) -> Result<&[u8], ResponseError> {
    let Some((&tag, rest)) = response.split_first() else {
        return Err(ResponseError::Empty);
    };
    if tag == ERROR {
        return Err(ResponseError::Refused(rest.first().copied().unwrap_or(0)));
    }
    if tag != expected {
        return Err(ResponseError::WrongService { expected, got: tag });
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_splits_back_into_its_tag_and_payload() {
        let framed = frame(BUTTERFLY, b"abc");
        assert_eq!(framed, b"\x01abc");
        assert_eq!(split(&framed), Ok((BUTTERFLY, &b"abc"[..])));
        assert_eq!(split(&frame(0xF3, b"")), Ok((0xF3, &b""[..])));
        assert_eq!(split(b""), Err(FrameError::Empty));
    }

    #[test]
    fn unclaimed_requests_get_error_responses() {
        let unknown = fallback_response(&frame(0x7E, b"x"));
        assert_eq!(
            open_response(&unknown, BUTTERFLY).unwrap_err().code(),
            Some(ErrorCode::UnknownService)
        );
        let empty = fallback_response(b"");
        assert_eq!(
            open_response(&empty, BUTTERFLY).unwrap_err().code(),
            Some(ErrorCode::Malformed)
        );
    }

    #[test]
    fn responses_of_other_services_or_truncated_ones_are_refused() {
        assert_eq!(open_response(b"", BUTTERFLY), Err(ResponseError::Empty));
        assert_eq!(
            open_response(b"\x05zz", BUTTERFLY),
            Err(ResponseError::WrongService {
                expected: BUTTERFLY,
                got: 5
            })
        );
        assert_eq!(
            open_response(b"\x00", BUTTERFLY),
            Err(ResponseError::Refused(0))
        );
        assert_eq!(
            open_response(b"\x00\x09", BUTTERFLY).unwrap_err().code(),
            None
        );
        assert_eq!(open_response(b"\x01ok", BUTTERFLY), Ok(&b"ok"[..]));
    }

    #[test]
    fn error_codes_round_trip_through_their_byte() {
        for code in [ErrorCode::UnknownService, ErrorCode::Malformed] {
            assert_eq!(ErrorCode::from_byte(code.byte()), Some(code));
        }
        assert_eq!(ErrorCode::from_byte(0), None);
        assert!(!EXPERIMENTAL.contains(&BUTTERFLY) && !EXPERIMENTAL.contains(&ERROR));
    }
}
