//! Errors as the OpenAI API returns them: a status code and
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, for 503 on overload.
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or asks for the impossible.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or wrong API key; send it as `Authorization: Bearer KEY`",
        );
        e.code = Some("invalid_api_key");
        e
    }

    pub fn model_not_found(name: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model `{name}` does not exist; this server serves `{served}`"),
        )
        .with_param("model");
        e.code = Some("model_not_found");
        e
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 503 with `Retry-After`: the queue is full, the model is loading, or the server is
    /// shutting down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.retry_after = Some(1);
        e
    }

    /// 500: a fault of the server itself (the GPU failed).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// The engine refused a request: name the parameter where the error does.
impl From<crate::engine::EngineError> for ApiError {
    fn from(e: crate::engine::EngineError) -> Self {
        use crate::engine::EngineError as E;
        use crate::sampling::SamplingError as S;
        match &e {
            E::Sampling(S::Invalid { param, .. }) => {
                ApiError::invalid(e.to_string()).with_param(*param)
            }
            E::Sampling(S::BeamSearchConflict { param, .. }) => {
                ApiError::invalid(e.to_string()).with_param(*param)
            }
            E::Constraint(crate::constrain::ConstraintError::Invalid { .. }) => {
                ApiError::invalid(e.to_string())
            }
            E::InvalidRequest(_) | E::Sampling(_) | E::Tokenizer(_) | E::RequestFailed(_) => {
                ApiError::invalid(e.to_string())
            }
            E::NotReady | E::Closed | E::Unavailable(_) => ApiError::unavailable(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}
