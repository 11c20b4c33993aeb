//! A submitted request's side of the engine: its events, read blocking, with a timeout, or
//! awaited; and its abort.

use super::Command;
use crate::engine::{EngineError, RequestEvent, RequestId, RequestOutput};
use std::time::Duration;

/// The events of one submitted request, in order: tokens as they are generated, then
/// exactly one `Finished` or `Failed`, after which the stream ends. Dropping the stream
/// aborts the request at the engine's next step and frees what it holds.
///
/// Iterating blocks for each event; [`RequestStream::recv_async`] and
/// [`RequestStream::into_stream`] serve async code without a runtime of their own.
#[derive(Debug)]
pub struct RequestStream {
    id: RequestId,
    events: flume::Receiver<RequestEvent>,
    commands: flume::Sender<Command>,
}

impl RequestStream {
    pub(super) fn new(
        id: RequestId,
        events: flume::Receiver<RequestEvent>,
        commands: flume::Sender<Command>,
    ) -> Self {
        RequestStream {
            id,
            events,
            commands,
        }
    }

    /// The engine's id of the request.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event, waiting for it; `None` once the stream has ended.
    pub fn recv(&self) -> Option<RequestEvent> {
        self.events.recv().ok()
    }

    /// The next event if one has arrived (`None` also once the stream has ended; see
    /// [`RequestStream::is_ended`]).
    pub fn try_recv(&self) -> Option<RequestEvent> {
        self.events.try_recv().ok()
    }

    /// The next event, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<RequestEvent> {
        self.events.recv_timeout(timeout).ok()
    }

    /// The next event, awaited; `None` once the stream has ended.
    pub async fn recv_async(&self) -> Option<RequestEvent> {
        self.events.recv_async().await.ok()
    }

    /// Whether every event has been read and no more will come.
    pub fn is_ended(&self) -> bool {
        self.events.is_disconnected() && self.events.is_empty()
    }

    /// The events as an async stream (`futures_core::Stream`). The request stays alive
    /// while the stream does.
    pub fn into_stream(self) -> impl futures_core::Stream<Item = RequestEvent> + Unpin {
        self.events.into_stream()
    }

    /// Asks the engine to abort the request: the stream ends with a `Finished` event whose
    /// outputs say `abort`.
    pub fn abort(&self) {
        let _ = self.commands.send(Command::Abort(self.id));
    }

    /// Waits for the final output, skipping streamed tokens.
    pub fn wait(self) -> Result<RequestOutput, EngineError> {
        for event in self.events.iter() {
            match event {
                RequestEvent::Finished(out) => return Ok(out),
                RequestEvent::Failed(msg) => return Err(EngineError::RequestFailed(msg)),
                RequestEvent::Token { .. } => {}
            }
        }
        Err(EngineError::RequestFailed(
            "the engine dropped the request".into(),
        ))
    }
}

impl Iterator for RequestStream {
    type Item = RequestEvent;

    fn next(&mut self) -> Option<RequestEvent> {
        self.recv()
    }
}
