//! The route's admission phase, before rate limits and faults: a CORS preflight is answered
//! here (it carries no credentials, so it comes before the JWT check), then the JWT is checked.
//! Refusals carry the CORS headers too, so a browser script can read why.

use http::header::{HeaderValue, WWW_AUTHENTICATE};
use http::{Request, Response, StatusCode};

use crate::body::ClientBody;
use crate::cors::CompiledCors;
use crate::forwarding::status_response;
use crate::router::CompiledRoute;

/// What admission leaves for the response phase: the `Access-Control-Allow-Origin` value when
/// the route has CORS and the request's origin is allowed.
pub struct Admitted {
    pub cors_origin: Option<HeaderValue>,
}

/// Answers a preflight, or checks the token; `Err` is the response to send instead.
pub fn admit<B>(route: &CompiledRoute, req: &mut Request<B>) -> Result<Admitted, Response<ClientBody>> {
    let cors_origin = match &route.cors {
        Some(cors) if CompiledCors::is_preflight(req.method(), req.headers()) => {
            return Err(preflight_answer(cors, req));
        }
        Some(cors) => cors.allowed_origin(req.headers()),
        None => None,
    };
    if let Some(jwt) = &route.jwt {
        if let Err(denial) = jwt.admit(req.headers_mut()) {
            let mut resp = status_response(
                StatusCode::UNAUTHORIZED,
                "unauthorized: a valid bearer token is required\n",
            );
            resp.headers_mut()
                .insert(WWW_AUTHENTICATE, denial.challenge(&jwt.realm));
            let admitted = Admitted { cors_origin };
            decorate(route, &admitted, &mut resp);
            tracing::debug!(route = %route.name, reason = denial.label(), "JWT refused");
            return Err(resp);
        }
    }
    Ok(Admitted { cors_origin })
}

/// The route's CORS headers on a response (the upstream's, or one the proxy made).
pub fn decorate(route: &CompiledRoute, admitted: &Admitted, resp: &mut Response<ClientBody>) {
    if let Some(cors) = &route.cors {
        cors.decorate(admitted.cors_origin.clone(), resp.headers_mut());
    }
}

fn preflight_answer<B>(cors: &CompiledCors, req: &Request<B>) -> Response<ClientBody> {
    match cors.preflight(req.headers()) {
        Ok(headers) => {
            let mut resp = Response::new(crate::body::full(""));
            *resp.status_mut() = StatusCode::NO_CONTENT;
            *resp.headers_mut() = headers;
            resp.extensions_mut().insert(crate::grpc::Generated);
            resp
        }
        Err(refusal) => status_response(StatusCode::FORBIDDEN, refusal.body()),
    }
}
