//! JSON bodies for the HTTP parser's own rejections.
//!
//! hyper answers a request it cannot parse (a malformed request line or header, a bad
//! `Content-Length`, a URI over its limit, too many or too large headers) by itself, before
//! any handler of ours runs, with an empty 400, 414 or 431, and offers no hook to shape that
//! response. Every response our handlers send carries a body (the fallback and the error
//! type see to that), so an empty response with one of those three statuses written to a
//! connection is, by construction, one of hyper's: [`JsonRejections`], a wrapper of the
//! connection's write side, gives it the `{"error": ...}` body every other error has.
//!
//! hyper writes such a response in one buffer (its head; it has no body) and then closes
//! the connection, so the wrapper looks only at writes that begin a response head and hold
//! all of it; anything else passes through unchanged.

use super::error::ApiError;
use axum::http::StatusCode;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection whose empty 400, 414 and 431 responses get a JSON error body.
pub struct JsonRejections<T> {
    inner: T,
    /// A rewritten response not yet fully written (the caller was told it was).
    pending: Vec<u8>,
    written: usize,
}

impl<T> JsonRejections<T> {
    pub fn new(inner: T) -> Self {
        JsonRejections {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// The error message for a status hyper sends by itself.
fn message(status: &[u8]) -> Option<&'static str> {
    Some(match status {
        b"400" => {
            "the request is not valid HTTP/1.1: a malformed request line or header, or a bad \
             Content-Length"
        }
        b"414" => "the request URI is longer than the server accepts",
        b"431" => "the request's headers are too many or too large",
        _ => return None,
    })
}

/// The response `buf` rewritten with a JSON body, when `buf` is one whole empty response
/// with a status hyper sends by itself.
fn rewrite(buf: &[u8]) -> Option<Vec<u8>> {
    let rest = buf.strip_prefix(b"HTTP/1.1 ")?;
    let msg = message(rest.get(..3)?)?;
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    if head_end + 4 != buf.len() {
        return None;
    }
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let mut kept = Vec::new();
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let name = name.trim().to_ascii_lowercase();
        match name.as_str() {
            // A body already, or one of unknown length: not an empty rejection.
            "content-length" if value.trim() != "0" => return None,
            "transfer-encoding" | "content-type" => return None,
            "content-length" => {}
            _ => kept.push(line),
        }
    }
    let status = std::str::from_utf8(&rest[..3]).ok()?.parse().ok()?;
    let mut err = ApiError::invalid(msg);
    err.status = StatusCode::from_u16(status).ok()?;
    let body = err.body().to_string();
    let mut out = format!("{status_line}\r\n");
    for line in kept {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    Some(out.into_bytes())
}

impl<T: AsyncWrite + Unpin> JsonRejections<T> {
    /// Writes what is left of a rewritten response.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for JsonRejections<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JsonRejections<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.drain(cx))?;
        if let Some(out) = rewrite(buf) {
            this.pending = out;
            // Start at once; whatever the socket does not take now goes at the next write,
            // flush or shutdown, which hyper always makes after a response.
            if let Poll::Ready(Err(e)) = this.drain(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    /// hyper writes a response head as one buffer of its own, so only a first buffer with
    /// nothing after it can be a rejection; everything else goes to the socket as given,
    /// vectored.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match bufs {
            [one, rest @ ..] if rest.iter().all(|b| b.is_empty()) => self.poll_write(cx, one),
            _ => {
                let this = &mut *self;
                ready!(this.drain(cx))?;
                Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    fn text(b: &[u8]) -> String {
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[test]
    fn an_empty_rejection_gets_a_json_body_and_keeps_its_other_headers() {
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\
                      content-length: 0\r\ndate: Fri, 04 Dec 2026 18:00:00 GMT\r\n\r\n";
        let out = text(&rewrite(hyper).unwrap());
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
        assert!(
            head.contains("\r\ndate: Fri, 04 Dec 2026 18:00:00 GMT\r\n"),
            "{head}"
        );
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert!(!head.contains("content-length: 0"), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("headers"));
    }

    #[test]
    fn responses_with_bodies_or_other_statuses_pass_unchanged() {
        for passes in [
            // Ours: a 400 with its JSON body, whole or head only.
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n{\"a\": 1}\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 9\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n",
            // Other statuses, empty or not.
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            // A head split across writes, and body bytes.
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
            b"data: {\"HTTP/1.1 400\"}\n\n",
        ] {
            assert!(rewrite(passes).is_none(), "{}", text(passes));
        }
        // Without any length header hyper's head still means no body.
        assert!(rewrite(b"HTTP/1.1 414 URI Too Long\r\n\r\n").is_some());
    }
}
