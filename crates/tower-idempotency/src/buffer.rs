//! Buffering bodies with a limit: the request body (to validate and fingerprint it) and
//! the handler's response body (to store it for replay).
//!
//! One-frame bodies, the common case, are kept as the `Bytes` they arrived in, without a
//! copy; only multi-frame bodies are concatenated.

use std::pin::{Pin, pin};

use bytes::{Bytes, BytesMut};
use http::{header, request::Parts};
use http_body::Body;
use http_body_util::BodyExt;

use crate::problem::Rejection;

/// Accumulates data frames, keeping a lone frame without copying it.
#[derive(Default)]
struct Collector {
    first: Option<Bytes>,
    rest: BytesMut,
    total: usize,
}

impl Collector {
    fn push(&mut self, data: Bytes) {
        self.total += data.len();
        match &self.first {
            None => self.first = Some(data),
            Some(_) => self.rest.extend_from_slice(&data),
        }
    }

    fn finish(self) -> Bytes {
        match self.first {
            None => Bytes::new(),
            Some(first) if self.rest.is_empty() => first,
            Some(first) => {
                let mut all = BytesMut::with_capacity(self.total);
                all.extend_from_slice(&first);
                all.extend_from_slice(&self.rest);
                all.freeze()
            }
        }
    }
}

/// Reads a request body of at most `limit` bytes (refusing a larger declared
/// `Content-Length` before reading anything).
pub(crate) async fn read_body<B>(body: B, parts: &Parts, limit: usize) -> Result<Bytes, Rejection>
where
    B: Body<Data = Bytes>,
{
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(Rejection::BodyTooLarge { limit });
    }
    let mut body = pin!(body);
    let mut collected = Collector::default();
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(|_| Rejection::BodyReadFailed)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        collected.push(data);
        if collected.total > limit {
            return Err(Rejection::BodyTooLarge { limit });
        }
    }
    Ok(collected.finish())
}

/// A response body read for storing.
pub(crate) enum Buffered<B: Body> {
    /// The whole body, within the limit.
    Complete(Bytes),
    /// Over the limit: what was read, and the rest of the stream.
    TooLarge(Bytes, Pin<Box<B>>),
    /// The body failed while being read.
    Failed(B::Error),
}

/// Reads a response body up to `limit` bytes. Trailers are not kept (see
/// `docs/http-contract.md`).
pub(crate) async fn buffer_response<B: Body<Data = Bytes>>(body: B, limit: usize) -> Buffered<B> {
    let mut body = Box::pin(body);
    let mut collected = Collector::default();
    loop {
        match body.as_mut().frame().await {
            None => return Buffered::Complete(collected.finish()),
            Some(Err(error)) => return Buffered::Failed(error),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                collected.push(data);
                if collected.total > limit {
                    return Buffered::TooLarge(collected.finish(), body);
                }
            }
        }
    }
}
