//! The engine for a host with one thread and an event loop (a browser's page or worker, a
//! single-threaded async runtime), where [`crate::EngineHandle`]'s engine thread cannot be:
//! [`LocalEngine`] shares the engine among the host's tasks, and its steps are awaited, not
//! waited for. Requests may be added and aborted at any time, from any task, also while a
//! step is awaited (they take effect when it ends: `Engine::add` and `Engine::abort` defer
//! them). Nothing holds the engine across an await, so no task ever finds it busy.
//!
//! The host drives it: `while engine.has_work() { engine.step().await; ... }`, streaming
//! the requests' events after each step, and yielding to its event loop after a step that
//! computed nothing (requests waiting for memory), since such a step awaits nothing.

use super::core::{Engine, EngineStats};
use super::error::{EngineError, Result};
use super::intake::Request;
use super::output::RequestId;
use super::request::RequestHandle;
use std::cell::{Ref, RefCell};
use std::rc::Rc;
use std::time::Duration;
use web_time::Instant;

/// An engine shared by the tasks of one thread (cloning shares it); see the module docs.
#[derive(Clone)]
pub struct LocalEngine {
    inner: Rc<RefCell<Local>>,
}

struct Local {
    engine: Engine,
    /// A step is begun and not yet ended (steps never overlap).
    stepping: bool,
}

/// What one awaited step did, and where its time went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepReport {
    /// Tokens the step computed.
    pub computed: usize,
    /// Beginning it: scheduling, recording and submitting its GPU work.
    pub begin: Duration,
    /// Awaiting the GPU's read-backs.
    pub wait: Duration,
    /// Ending it: sampling and streaming.
    pub end: Duration,
}

impl LocalEngine {
    pub fn new(engine: Engine) -> Self {
        LocalEngine {
            inner: Rc::new(RefCell::new(Local {
                engine,
                stepping: false,
            })),
        }
    }

    /// The engine, to read (its tokenizer, its context, its configuration). Held only for
    /// as long as the returned borrow lives; never across an await.
    pub fn engine(&self) -> Ref<'_, Engine> {
        Ref::map(self.inner.borrow(), |l| &l.engine)
    }

    /// Queues `request` (see [`Engine::add`]).
    pub fn add(&self, request: Request) -> Result<RequestHandle> {
        self.inner.borrow_mut().engine.add(request)
    }

    /// Aborts a request (see [`Engine::abort`]).
    pub fn abort(&self, id: RequestId) -> bool {
        self.inner.borrow_mut().engine.abort(id)
    }

    /// Whether any request is pending.
    pub fn has_unfinished(&self) -> bool {
        self.inner.borrow().engine.has_unfinished()
    }

    pub fn stats(&self) -> EngineStats {
        self.inner.borrow().engine.stats()
    }

    /// One step: begun, awaited until its read-backs land (the host's event loop lands
    /// them and wakes this future; natively something must poll the device, see
    /// [`Engine::step_async`]), ended. Errors as [`Engine::step`]; a second step while one
    /// is awaited is refused.
    pub async fn step(&self) -> Result<StepReport> {
        let t0 = Instant::now();
        let mut step = {
            let mut l = self.inner.borrow_mut();
            if l.stepping {
                return Err(EngineError::Internal(
                    "a step is already awaited; await it first".into(),
                ));
            }
            let step = l.engine.begin_step()?;
            l.stepping = true;
            step
        };
        let begin = t0.elapsed();
        let mut wait = Duration::ZERO;
        let ready = loop {
            let ready = self.inner.borrow_mut().engine.step_ready(&mut step);
            match ready {
                Ok(true) => break Ok(()),
                Ok(false) => {
                    let t = Instant::now();
                    step.landed().await;
                    wait += t.elapsed();
                }
                Err(e) => break Err(e),
            }
        };
        let t = Instant::now();
        let mut l = self.inner.borrow_mut();
        l.stepping = false;
        let ended = l.engine.end_step(step);
        let computed = ready.and(ended)?;
        Ok(StepReport {
            computed,
            begin,
            wait,
            end: t.elapsed(),
        })
    }

    /// Whether the engine should be stepped: requests are pending, or blocks computed by
    /// the last steps still wait to be written to the disk tier (one more step writes them,
    /// see [`Engine::has_unsaved_prefix_blocks`]).
    pub fn has_work(&self) -> bool {
        let l = self.inner.borrow();
        l.engine.has_unfinished() || l.engine.has_unsaved_prefix_blocks()
    }
}
