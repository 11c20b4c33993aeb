//! The admin endpoints, for the operator of the server rather than its clients; they need
//! the API key, so a server started without one has none. `POST /admin/kv_budget` with
//! `{"bytes": N}` or `{"blocks": N}` resizes the device KV pool while the server runs
//! (`EngineHandle::set_kv_budget`): a desktop that needs its GPU memory back for a game
//! shrinks it, and grows it again later; streams only pause.

use super::error::ApiError;
use super::state::AppState;
use crate::engine::EngineError;
use crate::pool::PoolSize;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;

/// `POST /admin/kv_budget`.
pub async fn kv_budget(State(app): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    if app.api_key.is_none() {
        let mut e = ApiError::invalid(
            "the admin endpoints need an API key: start the server with --api-key (or \
             PAGELLM_API_KEY)",
        );
        e.status = axum::http::StatusCode::FORBIDDEN;
        return e.into_response();
    }
    let size = match parse_size(&body) {
        Ok(size) => size,
        Err(e) => return e.into_response(),
    };
    let engine = app.engine.clone();
    let done = tokio::task::spawn_blocking(move || engine.set_kv_budget(size)).await;
    match done {
        Ok(Ok(r)) => axum::Json(json!({
            "blocks_before": r.blocks_before,
            "blocks_after": r.blocks_after,
            "bytes_before": r.bytes_before,
            "bytes_after": r.bytes_after,
            "preempted_groups": r.preempted_groups,
        }))
        .into_response(),
        Ok(Err(EngineError::Config(why))) => ApiError::invalid(why).into_response(),
        Ok(Err(
            e @ (EngineError::Unavailable(_) | EngineError::NotReady | EngineError::Closed),
        )) => ApiError::unavailable(e.to_string()).into_response(),
        Ok(Err(e)) => ApiError::internal(e.to_string()).into_response(),
        Err(e) => ApiError::internal(format!("the resize did not finish: {e}")).into_response(),
    }
}

/// `{"bytes": N}` or `{"blocks": N}`, exactly one of them.
fn parse_size(body: &[u8]) -> Result<PoolSize, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}")))?;
    let field = |name: &str| v.get(name).map(|x| (name.to_string(), x.as_u64()));
    let size = match (field("bytes"), field("blocks")) {
        (Some((_, Some(b))), None) => PoolSize::Bytes(b),
        (None, Some((_, Some(n)))) => PoolSize::Blocks(n as usize),
        (Some((name, None)), None) | (None, Some((name, None))) => {
            return Err(
                ApiError::invalid(format!("`{name}` must be a whole number")).with_param(name),
            )
        }
        _ => {
            return Err(ApiError::invalid(
                "give the new KV budget as {\"bytes\": N} or {\"blocks\": N}, one of them",
            ))
        }
    };
    if matches!(v.as_object(), Some(o) if o.len() > 1) {
        return Err(ApiError::invalid(
            "only `bytes` or `blocks` may be given: nothing else is read",
        ));
    }
    Ok(size)
}
