//! The accept loop: each connection served by hyper's HTTP/1 within bounds that no client,
//! however it behaves, can hold beyond.
//!
//! - **Heads.** A whole request head must arrive within `header_timeout` of the connection
//!   starting to wait for it (hyper's header-read timeout is a deadline, not a pause limit),
//!   so it bounds a client that trickles its headers (slowloris) and an idle keep-alive
//!   connection alike. A client that sent part of a head is answered with a JSON 408 (the
//!   socket comes back from hyper for it, see `Tracked`); an idle one is just closed.
//! - **Writes.** A response that cannot be written for `write_timeout` (the client stopped
//!   reading and the socket's buffers are full) fails its connection ([`WriteDeadline`]);
//!   dropping the response drops the engine request's stream, which aborts the request and
//!   frees its KV blocks.
//! - **Connections.** At most `max_connections` are open. When a client arrives at that
//!   limit, the connection that has waited longest for a request head (one that never sent
//!   a whole head, or an idle keep-alive one) is closed to make room; only when every
//!   connection is in the middle of a request does the new client wait (in the kernel's
//!   backlog, not holding a file descriptor). One peer (IP address) may hold at most
//!   `max_per_peer`: past it, that peer's own longest-waiting connection makes room, or,
//!   when all of its connections are busy, the new one is refused with a JSON 429.
//!
//! Each connection's writes pass through `JsonRejections`, so hyper's own answers to
//! unparsable requests carry JSON errors too. Every cut is counted in `/metrics`
//! (`pagellm_http_cuts_total`).

use super::error::ApiError;
use super::metrics::{cut, Metrics};
use super::rejections::JsonRejections;
use axum::body::Body;
use axum::http::StatusCode;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Sleep;
use tower::ServiceExt;

/// Bounds on connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Longest time for a complete request head, counted from when the connection starts
    /// waiting for it (so also how long an idle keep-alive connection stays open).
    pub header_timeout: Duration,
    pub max_connections: usize,
    /// Most connections one IP address may hold.
    pub max_per_peer: usize,
    /// Longest a response may be unable to write anything before its connection is closed.
    pub write_timeout: Duration,
}

/// The client's address, in every request's extensions (IPv4-mapped IPv6 addresses as
/// IPv4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Peer(pub IpAddr);

/// Accepts connections until `stop` turns true; returns the watcher of those still open,
/// whose `shutdown` closes each once its current response is done.
pub async fn accept(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown {
    let graceful = GracefulShutdown::new();
    let table = Arc::new(Table::new(metrics.clone()));
    let max = limits.max_connections.max(1);
    loop {
        // Accept only while there is room, or a connection that can make room.
        if !table
            .wait_until(&mut stop, |t| t.open() < max || t.any_waiting())
            .await
        {
            break;
        }
        let (tcp, addr) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors or a connection reset before accept: wait a
                    // moment rather than spin.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let peer = addr.ip().to_canonical();
        if table.lock().peer_open(peer) >= limits.max_per_peer.max(1) && !table.evict(Some(peer)) {
            metrics.cut(cut::PEER_CONNECTIONS);
            tokio::spawn(refuse(tcp, peer, limits.max_per_peer));
            continue;
        }
        // The connection that could make room may have begun a request meanwhile: then this
        // one waits, accepted but not served, for a slot.
        loop {
            if table.lock().open() < max || table.evict(None) {
                break;
            }
            if !table
                .wait_until(&mut stop, |t| t.open() < max || t.any_waiting())
                .await
            {
                return graceful;
            }
        }
        let slot = table.insert(peer);
        serve(tcp, slot, Peer(peer), &router, limits, &metrics, &graceful);
    }
    graceful
}

/// Serves connection `tcp` (holding `slot`) on its own task.
fn serve(
    tcp: TcpStream,
    slot: Arc<Slot>,
    peer: Peer,
    router: &Router,
    limits: ConnLimits,
    metrics: &Arc<Metrics>,
    graceful: &GracefulShutdown,
) {
    // Per-token SSE writes are small: send each at once.
    let _ = tcp.set_nodelay(true);
    // The connection comes back when hyper lets go of it, to answer a head cut at its
    // deadline.
    let (back, returned) = oneshot::channel();
    let after_flush = AfterFlush::default();
    let io = Tracked {
        inner: Some(WriteDeadline::new(
            JsonRejections::new(tcp),
            limits.write_timeout,
            metrics,
        )),
        read: slot.read.clone(),
        back: Some(back),
        after_flush: after_flush.clone(),
    };
    let service = Service {
        router: router.clone(),
        peer,
        slot: slot.clone(),
        after_flush,
    };
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(io), service);
    let conn = graceful.watch(conn);
    let metrics = metrics.clone();
    let header_timeout = limits.header_timeout;
    tokio::spawn(async move {
        let ended = tokio::select! {
            ended = conn => ended,
            // Closed to make room: it was waiting for a head, so nothing is lost.
            _ = slot.evicted.notified() => Ok(()),
        };
        // The connection is dropped by now, so its socket has come back.
        if let Err(e) = ended {
            if e.is_timeout() {
                metrics.cut(cut::HEAD_DEADLINE);
                // Part of a head came: the client is told (an idle keep-alive
                // connection is just closed).
                if let (true, Ok(io)) = (slot.head_begun(), returned.await) {
                    answer_head_timeout(io, header_timeout).await;
                }
            }
            tracing::debug!("connection ended: {e}");
        }
        drop(slot);
    });
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|&s| s).await;
}

/// Writes a JSON 408 for a request head not complete within `timeout` to a connection hyper
/// has let go of, and closes it.
async fn answer_head_timeout(mut io: impl AsyncWrite + Unpin, timeout: Duration) {
    let mut e = ApiError::invalid(format!(
        "the request head took longer than {} s (--header-timeout-secs)",
        timeout.as_secs_f64()
    ));
    e.status = StatusCode::REQUEST_TIMEOUT;
    let write = async {
        io.write_all(raw_response(&e).as_bytes()).await?;
        io.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), write).await;
}

/// `e` as a whole HTTP/1.1 response that closes its connection.
fn raw_response(e: &ApiError) -> String {
    let body = e.body().to_string();
    let retry = e
        .retry_after
        .map(|s| format!("retry-after: {s}\r\n"))
        .unwrap_or_default();
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         {retry}connection: close\r\n\r\n{body}",
        e.status.as_u16(),
        e.status.canonical_reason().unwrap_or(""),
        body.len()
    )
}

/// Answers a connection refused at the per-peer limit with a JSON 429 and closes it.
async fn refuse(mut tcp: TcpStream, peer: IpAddr, limit: usize) {
    let mut e = ApiError::invalid(format!(
        "{peer} has {limit} connections open, the most one address may hold \
         (--max-connections-per-peer); reuse them or close some"
    ));
    e.status = StatusCode::TOO_MANY_REQUESTS;
    e.retry_after = Some(1);
    let response = raw_response(&e);
    let write = async {
        tcp.write_all(response.as_bytes()).await?;
        tcp.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), write).await;
}

/// The open connections: which peer holds each, and which wait for a request head.
struct Table {
    state: Mutex<Conns>,
    /// Woken when a connection closes or starts waiting for a head.
    changed: Notify,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Conns {
    next_id: u64,
    conns: HashMap<u64, Conn>,
    per_peer: HashMap<IpAddr, usize>,
}

struct Conn {
    peer: IpAddr,
    /// Requests in progress (a response not yet written whole).
    busy: usize,
    /// Since when it waits for a request head, when `busy` is 0.
    waiting_since: Instant,
    evicted: Arc<Notify>,
}

impl Conns {
    fn open(&self) -> usize {
        self.conns.len()
    }

    fn peer_open(&self, peer: IpAddr) -> usize {
        self.per_peer.get(&peer).copied().unwrap_or(0)
    }

    fn any_waiting(&self) -> bool {
        self.conns.values().any(|c| c.busy == 0)
    }

    /// The connection (of `peer`, if given) that has waited longest for a request head.
    fn longest_waiting(&self, peer: Option<IpAddr>) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, c)| c.busy == 0 && peer.is_none_or(|p| p == c.peer))
            .min_by_key(|(id, c)| (c.waiting_since, **id))
            .map(|(id, _)| *id)
    }

    /// Forgets connection `id`; what its slot does afterwards changes nothing.
    fn remove(&mut self, id: u64) -> Option<Conn> {
        let conn = self.conns.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&conn.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&conn.peer);
            }
        }
        Some(conn)
    }
}

impl Table {
    fn new(metrics: Arc<Metrics>) -> Self {
        Table {
            state: Mutex::new(Conns::default()),
            changed: Notify::new(),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Conns> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(self: &Arc<Self>, peer: IpAddr) -> Arc<Slot> {
        let evicted = Arc::new(Notify::new());
        let mut t = self.lock();
        let id = t.next_id;
        t.next_id += 1;
        t.conns.insert(
            id,
            Conn {
                peer,
                busy: 0,
                waiting_since: Instant::now(),
                evicted: evicted.clone(),
            },
        );
        *t.per_peer.entry(peer).or_default() += 1;
        self.metrics.connections_open.set(t.open() as i64);
        Arc::new(Slot {
            table: self.clone(),
            id,
            evicted,
            read: Arc::default(),
            read_when_idle: AtomicU64::new(0),
        })
    }

    /// Closes the connection (of `peer`, if given) that has waited longest for a request
    /// head; false when none waits.
    fn evict(&self, peer: Option<IpAddr>) -> bool {
        let mut t = self.lock();
        let Some(conn) = t.longest_waiting(peer).and_then(|id| t.remove(id)) else {
            return false;
        };
        self.metrics.connections_open.set(t.open() as i64);
        drop(t);
        // A permit is stored if its task is not waiting yet.
        conn.evicted.notify_one();
        self.metrics.cut(cut::EVICTED);
        true
    }

    /// Waits until `ready` holds; false when `stop` turned true first.
    async fn wait_until(
        &self,
        stop: &mut watch::Receiver<bool>,
        ready: impl Fn(&Conns) -> bool,
    ) -> bool {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before looking, so a change in between still wakes it.
            changed.as_mut().enable();
            if *stop.borrow() {
                return false;
            }
            if ready(&self.lock()) {
                return true;
            }
            tokio::select! {
                _ = changed => {}
                _ = stopped(stop) => return false,
            }
        }
    }
}

/// A connection's place in the table, released when its task ends.
struct Slot {
    table: Arc<Table>,
    id: u64,
    evicted: Arc<Notify>,
    /// Bytes read from the connection.
    read: Arc<AtomicU64>,
    /// `read` when the connection last started waiting for a head.
    read_when_idle: AtomicU64,
}

impl Slot {
    /// Marks a request in progress until the guard is dropped.
    fn busy(self: &Arc<Self>) -> Busy {
        if let Some(c) = self.table.lock().conns.get_mut(&self.id) {
            c.busy += 1;
        }
        Busy(Some(self.clone()))
    }

    /// Whether some of a request head has arrived since the connection began waiting.
    fn head_begun(&self) -> bool {
        self.read.load(Ordering::Relaxed) > self.read_when_idle.load(Ordering::Relaxed)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = self.table.lock();
        if t.remove(self.id).is_some() {
            self.table.metrics.connections_open.set(t.open() as i64);
        }
        drop(t);
        self.table.changed.notify_waiters();
    }
}

/// A request in progress on a connection; dropped when its response is written whole (or
/// abandoned), after which the connection waits for its next head.
struct Busy(Option<Arc<Slot>>);

impl Drop for Busy {
    fn drop(&mut self) {
        let Some(slot) = self.0.take() else {
            return;
        };
        let mut t = slot.table.lock();
        if let Some(c) = t.conns.get_mut(&slot.id) {
            c.busy -= 1;
            if c.busy == 0 {
                c.waiting_since = Instant::now();
                let read = slot.read.load(Ordering::Relaxed);
                slot.read_when_idle.store(read, Ordering::Relaxed);
            }
        }
        drop(t);
        slot.table.changed.notify_waiters();
    }
}

/// The router, for one connection: each request gets the peer's address and keeps the
/// connection marked busy until its response is written whole.
#[derive(Clone)]
struct Service {
    router: Router,
    peer: Peer,
    slot: Arc<Slot>,
    after_flush: AfterFlush,
}

/// A finished response's [`Busy`], released once the connection's writes are flushed: only
/// then may a connection be closed to make room without cutting a response short.
type AfterFlush = Arc<Mutex<Option<Busy>>>;

impl hyper::service::Service<hyper::Request<Incoming>> for Service {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, mut req: hyper::Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(self.peer);
        let busy = Some(self.slot.busy());
        let router = self.router.clone();
        let after_flush = self.after_flush.clone();
        Box::pin(async move {
            let response = router.oneshot(req.map(Body::new)).await?;
            Ok(response.map(|body| {
                Body::new(HeldBody {
                    body,
                    busy,
                    after_flush,
                })
            }))
        })
    }
}

/// A response body that keeps its connection marked busy; once hyper is done with it (it
/// ended, or the connection did), until the next flush.
struct HeldBody {
    body: Body,
    busy: Option<Busy>,
    after_flush: AfterFlush,
}

impl Drop for HeldBody {
    fn drop(&mut self) {
        let mut cell = self.after_flush.lock().unwrap_or_else(|e| e.into_inner());
        *cell = self.busy.take();
    }
}

impl hyper::body::Body for HeldBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection that counts the bytes read from it and, once dropped (hyper has let go of
/// it), is sent back through `back`.
struct Tracked<T> {
    inner: Option<T>,
    read: Arc<AtomicU64>,
    back: Option<oneshot::Sender<T>>,
    /// Released by the next flush that completes.
    after_flush: AfterFlush,
}

impl<T> Drop for Tracked<T> {
    fn drop(&mut self) {
        if let (Some(io), Some(back)) = (self.inner.take(), self.back.take()) {
            let _ = back.send(io);
        }
    }
}

impl<T: Unpin> Tracked<T> {
    fn io(&mut self) -> io::Result<Pin<&mut T>> {
        self.inner
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = self.io()?.poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.io()?.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.io()?.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(T::is_write_vectored)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = self.io()?.poll_flush(cx);
        if matches!(flushed, Poll::Ready(Ok(()))) {
            let done = self
                .after_flush
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            drop(done);
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io()?.poll_shutdown(cx)
    }
}

/// A connection whose writes fail once none has made progress for `limit`: a client that
/// stops reading cannot hold a response (and its engine request) forever.
pub struct WriteDeadline<T> {
    inner: T,
    limit: Duration,
    /// Running while a write waits.
    stalled: Option<Pin<Box<Sleep>>>,
    metrics: Option<Arc<Metrics>>,
}

impl<T> WriteDeadline<T> {
    pub fn new(inner: T, limit: Duration, metrics: &Arc<Metrics>) -> Self {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
            metrics: Some(metrics.clone()),
        }
    }

    /// What a write that returned `polled` returns: an error in its place once it has
    /// waited for the limit.
    fn bound<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if let Some(m) = self.metrics.take() {
            m.cut(cut::WRITE_STALL);
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client read nothing for {} s (--write-timeout-secs)",
                limit.as_secs_f64()
            ),
        )))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.bound(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.bound(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.bound(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.bound(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn cuts(m: &Metrics, kind: &str) -> u64 {
        let line = format!("pagellm_http_cuts_total{{kind=\"{kind}\"}} ");
        m.encode()
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.parse().ok())
            .unwrap_or_else(|| panic!("no {line} in {}", m.encode()))
    }

    #[test]
    fn the_longest_waiting_connection_makes_room_and_busy_ones_never_do() {
        let metrics = Arc::new(Metrics::new());
        let table = Arc::new(Table::new(metrics.clone()));
        let (a, b) = (ip(2), ip(3));
        let first = table.insert(a);
        std::thread::sleep(Duration::from_millis(2));
        let second = table.insert(a);
        std::thread::sleep(Duration::from_millis(2));
        let third = table.insert(b);
        let counts = |t: &Table| {
            let t = t.lock();
            (t.open(), t.peer_open(a))
        };
        assert_eq!(counts(&table), (3, 2));
        // The oldest is busy with a request: the next oldest goes, and only once.
        let busy = first.busy();
        assert!(table.evict(None));
        assert_eq!(table.lock().peer_open(a), 1);
        assert!(!table.evict(Some(a)), "a's only other connection is busy");
        // A connection whose request ended waits anew, younger than `third`.
        drop(busy);
        assert_eq!(table.lock().longest_waiting(None), Some(third.id));
        assert_eq!(table.lock().longest_waiting(Some(a)), Some(first.id));
        assert_eq!(cuts(&metrics, cut::EVICTED), 1);
        // The evicted connection's task was told (the permit waits for it), and its slot's
        // end changes nothing more.
        let told = second.evicted.clone();
        assert!(futures_util::FutureExt::now_or_never(told.notified()).is_some());
        drop(second);
        assert_eq!(counts(&table), (2, 1));
        drop((first, third));
        assert_eq!(table.lock().open(), 0);
        assert!(table.lock().per_peer.is_empty());
        assert!(metrics.encode().contains("pagellm_http_connections_open 0"));
    }

    /// At the connection limit, a newcomer may take the place of a connection waiting for a
    /// head, never of one whose response is still being written (even when hyper is done
    /// with the response body and only the socket lags behind).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_response_being_written_is_never_cut_to_make_room() {
        const BIG: usize = 8 << 20;
        let router = Router::new().route("/big", axum::routing::get(|| async { vec![b'x'; BIG] }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ConnLimits {
            header_timeout: Duration::from_secs(10),
            max_connections: 1,
            max_per_peer: 4,
            write_timeout: Duration::from_secs(30),
        };
        let metrics = Arc::new(Metrics::new());
        let (stop, stopped) = watch::channel(false);
        let server = tokio::spawn(accept(listener, router, limits, metrics.clone(), stopped));
        // The first client asks for 8 MiB and reads none of it for a while.
        let mut first = TcpStream::connect(addr).await.unwrap();
        first
            .write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // A second arrives at the limit, and waits.
        let mut second = TcpStream::connect(addr).await.unwrap();
        second
            .write_all(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(cuts(&metrics, cut::EVICTED), 0);
        // The first reads its whole response; then, idle, it makes room for the second.
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let whole = loop {
            let n = first.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "the first response was cut after {} bytes",
                got.len()
            );
            got.extend_from_slice(&buf[..n]);
            if let Some(head) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                if got.len() == head + 4 + BIG {
                    break got;
                }
            }
        };
        assert!(whole.starts_with(b"HTTP/1.1 200"));
        let mut rest = Vec::new();
        second.read_to_end(&mut rest).await.unwrap();
        assert!(
            rest.starts_with(b"HTTP/1.1 200") && rest.len() > BIG,
            "{}",
            rest.len()
        );
        assert_eq!(cuts(&metrics, cut::EVICTED), 1);
        assert_eq!(
            first.read(&mut buf).await.unwrap(),
            0,
            "closed to make room"
        );
        stop.send(true).unwrap();
        drop(server.await.unwrap());
    }

    #[tokio::test]
    async fn a_write_nobody_reads_fails_at_its_deadline_and_a_slow_reader_does_not() {
        let metrics = Arc::new(Metrics::new());
        let limit = Duration::from_millis(300);
        // A client that reads 64 bytes every 100 ms: slow, but never stalled.
        let (server, mut client) = tokio::io::duplex(64);
        let mut w = WriteDeadline::new(server, limit, &metrics);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut got = 0;
            while got < 1024 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                got += client.read(&mut buf).await.unwrap();
            }
            got
        });
        let start = Instant::now();
        w.write_all(&[7u8; 1024]).await.unwrap();
        w.flush().await.unwrap();
        assert!(
            start.elapsed() > Duration::from_millis(900),
            "it waited for the reader"
        );
        assert_eq!(reader.await.unwrap(), 1024);
        assert_eq!(cuts(&metrics, cut::WRITE_STALL), 0);
        // A client that never reads.
        let (server, _client) = tokio::io::duplex(64);
        let mut w = WriteDeadline::new(server, limit, &metrics);
        let start = Instant::now();
        let e = w.write_all(&[7u8; 1024]).await.unwrap_err();
        let took = start.elapsed();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("--write-timeout-secs"), "{e}");
        assert!(took >= limit && took < limit * 3, "{took:?}");
        assert_eq!(cuts(&metrics, cut::WRITE_STALL), 1);
    }
}
