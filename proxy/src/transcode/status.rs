//! gRPC status codes as HTTP answers: the mapping of google/rpc/code.proto (as grpc-gateway and
//! Envoy's transcoder use it) and the `google.rpc.Status` JSON body.

use http::StatusCode;

/// (name, HTTP status) of a gRPC status code.
pub fn describe(code: u32) -> (&'static str, StatusCode) {
    match code {
        0 => ("OK", StatusCode::OK),
        1 => (
            "CANCELLED",
            StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        ),
        2 => ("UNKNOWN", StatusCode::INTERNAL_SERVER_ERROR),
        3 => ("INVALID_ARGUMENT", StatusCode::BAD_REQUEST),
        4 => ("DEADLINE_EXCEEDED", StatusCode::GATEWAY_TIMEOUT),
        5 => ("NOT_FOUND", StatusCode::NOT_FOUND),
        6 => ("ALREADY_EXISTS", StatusCode::CONFLICT),
        7 => ("PERMISSION_DENIED", StatusCode::FORBIDDEN),
        8 => ("RESOURCE_EXHAUSTED", StatusCode::TOO_MANY_REQUESTS),
        9 => ("FAILED_PRECONDITION", StatusCode::BAD_REQUEST),
        10 => ("ABORTED", StatusCode::CONFLICT),
        11 => ("OUT_OF_RANGE", StatusCode::BAD_REQUEST),
        12 => ("UNIMPLEMENTED", StatusCode::NOT_IMPLEMENTED),
        13 => ("INTERNAL", StatusCode::INTERNAL_SERVER_ERROR),
        14 => ("UNAVAILABLE", StatusCode::SERVICE_UNAVAILABLE),
        15 => ("DATA_LOSS", StatusCode::INTERNAL_SERVER_ERROR),
        16 => ("UNAUTHENTICATED", StatusCode::UNAUTHORIZED),
        _ => ("UNKNOWN", StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// `{"code": 5, "message": "...", "details": []}`, as grpc-gateway answers errors.
pub fn error_json(code: u32, message: &str) -> serde_json::Value {
    serde_json::json!({ "code": code, "message": message, "details": [] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn google_rpc_code_mapping() {
        let http: Vec<u16> = (0..=16).map(|c| describe(c).1.as_u16()).collect();
        assert_eq!(
            http,
            [200, 499, 500, 400, 504, 404, 409, 403, 429, 400, 409, 400, 501, 500, 503, 500, 401]
        );
        assert_eq!(describe(99), ("UNKNOWN", StatusCode::INTERNAL_SERVER_ERROR));
    }
}
