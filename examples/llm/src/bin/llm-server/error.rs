//! The error responses: OpenAI's `{"error": {"message", "type", "param", "code"}}` with the
//! HTTP status, and how the batcher's refusals map onto them.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use rknn_llm::model::ModelError;
use rknn_llm::serve::ServeError;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// The request parameter it is about, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`); the HTTP status number when none.
    pub code: Option<&'static str>,
    /// Whether the client may retry soon (`Retry-After: 1`).
    pub retry: bool,
    /// The model is still loading: llama-server's exact object, without `param`.
    pub loading: bool,
}

impl ApiError {
    /// An error of `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry: false,
            loading: false,
        }
    }

    /// 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 about the parameter `param`.
    pub fn param(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.into()),
            ..ApiError::bad_request(message)
        }
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// 503 while the model loads.
    pub fn loading() -> ApiError {
        ApiError {
            loading: true,
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Loading model")
        }
    }

    /// 503 with `Retry-After: 1`.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            retry: true,
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// 504: the request's deadline passed.
    pub fn deadline() -> ApiError {
        ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "the request did not finish within the server's --timeout",
        )
    }

    /// With the code `code`.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The error object's `type`.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            503 => "unavailable_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The whole body, `{"error": {...}}`.
    pub fn body(&self) -> Value {
        let code = match self.code {
            Some(c) => json!(c),
            None => json!(self.status.as_u16()),
        };
        let error = if self.loading {
            json!({"message": self.message, "type": self.kind(), "code": code})
        } else {
            json!({"message": self.message, "type": self.kind(), "param": self.param, "code": code})
        };
        json!({ "error": error })
    }

    /// The batcher's refusal or failure `e` of a request whose prompt came from `prompt_param`
    /// (`messages` or `prompt`).
    pub fn from_serve(e: ServeError, prompt_param: &str) -> ApiError {
        match e {
            ServeError::QueueFull { .. } => {
                ApiError::unavailable(format!("the server is busy: {e}; retry later"))
            }
            ServeError::ShuttingDown => ApiError::unavailable(e.to_string()),
            ServeError::DeadlineExceeded => ApiError::deadline(),
            ServeError::PromptTooLong { .. } => {
                ApiError::param(prompt_param, e.to_string()).with_code("context_length_exceeded")
            }
            ServeError::EmptyPrompt | ServeError::BadToken { .. } => {
                ApiError::param(prompt_param, e.to_string())
            }
            ServeError::Embedding(
                ModelError::EmbeddingInput { .. }
                | ModelError::UnsupportedPooling { .. }
                | ModelError::NoPooling { .. },
            ) => ApiError::param(prompt_param, e.to_string()),
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = json_response(self.status, &self.body());
        if self.retry {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// `value` as an `application/json` response of `status`.
pub fn json_response(status: StatusCode, value: &Value) -> Response {
    let mut r = (status, value.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loading_object_is_llama_servers() {
        assert_eq!(
            ApiError::loading().body(),
            json!({"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}})
        );
    }

    #[test]
    fn a_long_prompt_names_its_parameter_and_code() {
        let e = ApiError::from_serve(
            ServeError::PromptTooLong {
                tokens: 10,
                n_ctx: 4,
            },
            "prompt",
        );
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let b = e.body();
        assert_eq!(b["error"]["param"], "prompt");
        assert_eq!(b["error"]["code"], "context_length_exceeded");
        assert_eq!(b["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn a_full_queue_asks_to_retry() {
        let e = ApiError::from_serve(ServeError::QueueFull { slots: 1, queue: 0 }, "prompt");
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
