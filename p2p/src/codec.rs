//! The request-response wire codec for `/iota/rr/1.0.0`.
//!
//! A frame is a `u64` big-endian length followed by that many bytes; a request and a response
//! are one frame each. Guarantees: the length is checked against the configured maximum
//! *before* any buffer is allocated, so a peer claiming 4 GiB costs nothing; a frame that is
//! oversized, truncated or otherwise short is an `io::Error` (`InvalidData` or
//! `UnexpectedEof`), never a panic. Frames larger than the maximum are also refused on write.

use std::io;

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::StreamProtocol;

use crate::Metrics;

/// The single request-response protocol of the node.
pub const PROTOCOL: StreamProtocol = StreamProtocol::new("/iota/rr/1.0.0");

/// Bytes of the length prefix.
const PREFIX_LEN: usize = 8;

/// Length-prefixed byte frames with a maximum size; see the module documentation.
#[derive(Clone, Debug)]
pub struct Codec {
    max_frame_bytes: usize,
    metrics: Metrics,
}

impl Codec {
    /// A codec that accepts and writes frames of at most `max_frame_bytes` payload bytes and
    /// counts frame bytes in `metrics`.
    pub fn new(max_frame_bytes: usize, metrics: Metrics) -> Self {
        Self {
            max_frame_bytes,
            metrics,
        }
    }

    /// The largest payload accepted.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    async fn read<T>(&self, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        let data = read_frame(io, self.max_frame_bytes).await?;
        self.metrics.rr_received((PREFIX_LEN + data.len()) as u64);
        Ok(data)
    }

    async fn write<T>(&self, io: &mut T, data: &[u8]) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_frame(io, data, self.max_frame_bytes).await?;
        self.metrics.rr_sent((PREFIX_LEN + data.len()) as u64);
        Ok(())
    }
}

/// Reads one frame of at most `max` payload bytes.
pub(crate) async fn read_frame<T>(io: &mut T, max: usize) -> io::Result<Vec<u8>>
where
    T: AsyncRead + Unpin,
{
    let mut prefix = [0u8; PREFIX_LEN];
    io.read_exact(&mut prefix).await?;
    let claimed = u64::from_be_bytes(prefix);
    let len = match usize::try_from(claimed) {
        Ok(len) if len <= max => len,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame of {claimed} bytes exceeds the maximum of {max}"),
            ))
        }
    };
    // Allocated only now that the size is known to be acceptable; `read_exact` fails with
    // `UnexpectedEof` if the peer sends fewer bytes than it claimed.
    let mut data = vec![0u8; len];
    io.read_exact(&mut data).await?;
    Ok(data)
}

/// Writes one frame; refuses payloads larger than `max`.
pub(crate) async fn write_frame<T>(io: &mut T, data: &[u8], max: usize) -> io::Result<()>
where
    T: AsyncWrite + Unpin,
{
    if data.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("frame of {} bytes exceeds the maximum of {max}", data.len()),
        ));
    }
    io.write_all(&(data.len() as u64).to_be_bytes()).await?;
    io.write_all(data).await?;
    io.flush().await
}

impl libp2p::request_response::Codec for Codec {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        self.read(io).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        self.read(io).await
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        self.write(io, &req).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        self.write(io, &res).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{executor::block_on, io::Cursor};
    use libp2p::request_response::Codec as _;

    fn frame(claimed: u64, body: &[u8]) -> Vec<u8> {
        let mut v = claimed.to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn request_and_response_round_trip_in_memory() {
        let metrics = Metrics::unregistered();
        let mut codec = Codec::new(1 << 20, metrics.clone());
        let request: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let response = b"ok".to_vec();

        let mut wire = Cursor::new(Vec::new());
        block_on(codec.write_request(&PROTOCOL, &mut wire, request.clone())).unwrap();
        block_on(codec.write_response(&PROTOCOL, &mut wire, response.clone())).unwrap();
        assert_eq!(
            wire.get_ref().len(),
            2 * PREFIX_LEN + request.len() + response.len()
        );

        wire.set_position(0);
        let got_req = block_on(codec.read_request(&PROTOCOL, &mut wire)).unwrap();
        let got_res = block_on(codec.read_response(&PROTOCOL, &mut wire)).unwrap();
        assert_eq!(got_req, request);
        assert_eq!(got_res, response);
        let expected = (2 * PREFIX_LEN + request.len() + response.len()) as u64;
        assert_eq!(metrics.rr_bytes(), (expected, expected));
    }

    #[test]
    fn empty_frame_round_trips() {
        let mut codec = Codec::new(16, Metrics::unregistered());
        let mut wire = Cursor::new(Vec::new());
        block_on(codec.write_request(&PROTOCOL, &mut wire, Vec::new())).unwrap();
        wire.set_position(0);
        assert!(block_on(codec.read_request(&PROTOCOL, &mut wire))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn claim_of_four_gib_is_refused_before_allocating() {
        // Only the prefix is sent: if the codec tried to allocate or read 4 GiB the test would
        // run out of memory or report UnexpectedEof instead of InvalidData.
        let mut wire = Cursor::new(frame(4 << 30, b""));
        let err = block_on(read_frame(&mut wire, 64 << 20)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let mut wire = Cursor::new(frame(u64::MAX, b"x"));
        let err = block_on(read_frame(&mut wire, 64 << 20)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn one_byte_over_the_maximum_is_refused() {
        let metrics = Metrics::unregistered();
        let mut codec = Codec::new(10, metrics.clone());
        let mut wire = Cursor::new(frame(11, &[7; 11]));
        let err = block_on(codec.read_request(&PROTOCOL, &mut wire)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let mut wire = Cursor::new(frame(10, &[7; 10]));
        assert_eq!(
            block_on(codec.read_request(&PROTOCOL, &mut wire)).unwrap(),
            vec![7; 10]
        );
        assert_eq!(metrics.rr_bytes(), (0, (PREFIX_LEN + 10) as u64));
    }

    #[test]
    fn oversized_write_is_refused_and_writes_nothing() {
        let mut codec = Codec::new(10, Metrics::unregistered());
        let mut wire = Cursor::new(Vec::new());
        let err = block_on(codec.write_request(&PROTOCOL, &mut wire, vec![0; 11])).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(wire.get_ref().is_empty());
    }

    #[test]
    fn truncated_frames_are_errors() {
        // Body shorter than claimed.
        let mut wire = Cursor::new(frame(100, &[1; 40]));
        let err = block_on(read_frame(&mut wire, 1000)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // Prefix itself cut short.
        let mut wire = Cursor::new(vec![0u8, 0, 0]);
        let err = block_on(read_frame(&mut wire, 1000)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // Nothing at all.
        let mut wire = Cursor::new(Vec::new());
        assert!(block_on(read_frame(&mut wire, 1000)).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        // Deterministic pseudo-random garbage of many lengths: every outcome is either a frame
        // within the limit or an error.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..200usize {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let mut bytes = bytes;
            // Every other input gets a small length claim, so short bodies and frames that
            // fit are exercised too, not only huge claims.
            if len % 2 == 1 && len >= 8 {
                bytes[..7].fill(0);
            }
            let mut wire = Cursor::new(bytes.clone());
            match block_on(read_frame(&mut wire, 64)) {
                Ok(data) => {
                    assert!(data.len() <= 64);
                    assert_eq!(data, bytes[8..8 + data.len()]);
                }
                Err(e) => assert!(matches!(
                    e.kind(),
                    io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
                )),
            }
        }
    }
}
