//! Checks of a route's targets: one upstream or weighted backends, sticky keys, overrides and
//! the mirror, each error naming its field.

use std::collections::HashSet;

use crate::field::{err, http_header_name_invalid, http_token, FieldError};
use crate::{LiveWeights, Route};

pub(crate) fn check_route_backends(f: &str, r: &Route, upstreams: &HashSet<&str>, errors: &mut Vec<FieldError>) {
    let unknown = |u: &str| format!("unknown upstream {u:?}; define it in upstreams");
    match (r.upstream.is_empty(), r.backends.is_empty()) {
        (true, true) => errors.push(err(format!("{f}.upstream"), "give upstream or backends")),
        (false, false) => errors.push(err(format!("{f}.backends"), "give upstream or backends, not both")),
        (false, true) if !upstreams.contains(r.upstream.as_str()) => {
            errors.push(err(format!("{f}.upstream"), unknown(&r.upstream)))
        }
        _ => {}
    }
    let mut seen = HashSet::new();
    for (j, b) in r.backends.iter().enumerate() {
        if !upstreams.contains(b.upstream.as_str()) {
            errors.push(err(format!("{f}.backends[{j}].upstream"), unknown(&b.upstream)));
        }
        if !seen.insert(b.upstream.as_str()) {
            errors.push(err(format!("{f}.backends[{j}].upstream"), "listed twice"));
        }
        if b.weight > 100 {
            errors.push(err(format!("{f}.backends[{j}].weight"), "must be within 0-100"));
        }
    }
    let sum: u32 = r.backends.iter().map(|b| u32::from(b.weight)).sum();
    if !r.backends.is_empty() && sum != 100 {
        errors.push(err(
            format!("{f}.backends"),
            format!("weights sum to {sum}; they must sum to 100"),
        ));
    }
    if let Some(s) = &r.sticky {
        check_key(&format!("{f}.sticky"), s.header.as_deref(), s.cookie.as_deref(), errors);
        if r.backends.is_empty() {
            errors.push(err(format!("{f}.sticky"), "needs backends to choose between"));
        }
    }
    for (j, o) in r.overrides.iter().enumerate() {
        let g = format!("{f}.overrides[{j}]");
        check_key(
            &g,
            o.header.as_ref().map(|h| h.name.as_str()),
            o.cookie.as_ref().map(|c| c.name.as_str()),
            errors,
        );
        if !seen.contains(o.upstream.as_str()) {
            errors.push(err(
                format!("{g}.upstream"),
                "must be one of the route's backends[].upstream",
            ));
        }
    }
    if let Some(m) = &r.mirror {
        if !upstreams.contains(m.upstream.as_str()) {
            errors.push(err(format!("{f}.mirror.upstream"), unknown(&m.upstream)));
        }
        if !(0.0..=100.0).contains(&m.percent) {
            errors.push(err(format!("{f}.mirror.percent"), "must be within 0-100"));
        }
    }
}

/// Exactly one of a header or a cookie name, well formed.
fn check_key(f: &str, header: Option<&str>, cookie: Option<&str>, errors: &mut Vec<FieldError>) {
    match (header, cookie) {
        (Some(h), None) if http_header_name_invalid(h) => {
            errors.push(err(format!("{f}.header"), format!("{h:?} is not a header name")))
        }
        (None, Some(c)) if http_token(c).is_none() => {
            errors.push(err(format!("{f}.cookie"), format!("{c:?} is not a cookie name")))
        }
        (Some(_), None) | (None, Some(_)) => {}
        _ => errors.push(err(f.to_string(), "give exactly one of header or cookie")),
    }
}

/// Whether `w` fits a route's backends: exactly them, summing to 100. The error says why not.
pub fn check_live_weights(route: &Route, w: &LiveWeights) -> Result<(), String> {
    if route.backends.is_empty() {
        return Err(format!("route {:?} has no backends to weigh", route.name));
    }
    let names: HashSet<&str> = route.backends.iter().map(|b| b.upstream.as_str()).collect();
    let given: HashSet<&str> = w.weights.keys().map(String::as_str).collect();
    if names != given {
        return Err(format!(
            "weights must name exactly the route's backends {:?}",
            route.backends.iter().map(|b| &b.upstream).collect::<Vec<_>>()
        ));
    }
    let sum: u32 = w.weights.values().map(|v| u32::from(*v)).sum();
    if sum != 100 {
        return Err(format!("weights sum to {sum}; they must sum to 100"));
    }
    Ok(())
}
