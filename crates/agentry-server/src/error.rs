//! Every error the API returns: JSON `{"error": {"code", "message", "details"}}` with a fitting
//! status. Bad input is a 4xx with a message a person can act on, never a 500.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use agentry_app::domain::core::RunError;
use agentry_app::domain::core::session::SessionError;
use agentry_app::domain::core::tool::ToolError;
use agentry_app::domain::store::StoreError;
use agentry_app::error::{AppError, Failure};

/// An API error.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable code (`invalid_request`, `not_found`, `conflict`, …).
    pub code: &'static str,
    /// What went wrong, for a person.
    pub message: String,
    /// Extra structured detail.
    pub details: Option<serde_json::Value>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: None,
        }
    }

    /// 400 `invalid_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        AppError::bad_request(message).into()
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        AppError::not_found(message).into()
    }

    /// 409 `conflict`.
    pub fn conflict(message: impl Into<String>) -> Self {
        AppError::conflict(message).into()
    }

    /// 500 `internal`: a bug or a failing dependency, never bad input.
    pub fn internal(message: impl Into<String>) -> Self {
        AppError::internal(message).into()
    }

    /// Adds details.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(details) = &self.details {
            error["details"] = details.clone();
        }
        json!({ "error": error })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code,
            self.status.as_u16(),
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, "{}", self.message);
        }
        let retry_after = (self.status == StatusCode::TOO_MANY_REQUESTS)
            .then(|| {
                self.details
                    .as_ref()
                    .and_then(|details| details.get("retry_after_secs"))
                    .and_then(serde_json::Value::as_u64)
            })
            .flatten();
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = match rejection {
            JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            JsonRejection::BytesRejection(_) => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request_too_large"
        } else {
            "invalid_request"
        };
        Self::new(status, code, rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

impl From<AppError> for ApiError {
    fn from(error: AppError) -> Self {
        let status = match error.failure {
            Failure::Invalid => StatusCode::BAD_REQUEST,
            Failure::Unauthenticated => StatusCode::UNAUTHORIZED,
            Failure::Forbidden => StatusCode::FORBIDDEN,
            Failure::NotFound => StatusCode::NOT_FOUND,
            Failure::Conflict => StatusCode::CONFLICT,
            Failure::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Failure::TooMany => StatusCode::TOO_MANY_REQUESTS,
            Failure::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Failure::Upstream => StatusCode::BAD_GATEWAY,
            Failure::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Failure::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Failure::StorageFull => StatusCode::INSUFFICIENT_STORAGE,
        };
        Self {
            status,
            code: error.code,
            message: error.message,
            details: error.details,
        }
    }
}

/// Errors of the layers below, through the application's mapping ([`AppError`]).
macro_rules! through_app_error {
    ($($error:ty),*) => {$(
        impl From<$error> for ApiError {
            fn from(error: $error) -> Self {
                AppError::from(error).into()
            }
        }
    )*};
}

through_app_error!(StoreError, RunError, SessionError, ToolError);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_run_queue_is_429() {
        let session = agentry_types::SessionId::new();
        let error = ApiError::from(SessionError::QueueFull { session, max: 16 });
        assert_eq!(error.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(error.code, "queue_full");
        assert!(
            error.message.contains("16 runs queued"),
            "{}",
            error.message
        );
        assert_eq!(
            error.details,
            Some(json!({"session_id": session, "max_queued_runs": 16}))
        );
    }
}
