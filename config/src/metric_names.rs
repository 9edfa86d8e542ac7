//! Names of the proxy metrics the operator judges canaries by: registered by the proxy under
//! `PREFIX`, read by the operator (direct scraping and generated PromQL). A contract test in
//! the proxy checks its /metrics carries each full name.

/// Registry prefix of every proxy metric.
pub const PREFIX: &str = "proxyfleet";
/// Counter of responses by route, upstream and `code_class` (registered name).
pub const RESPONSES: &str = "responses";
/// Histogram of request durations in seconds by route and upstream (registered name).
pub const REQUEST_DURATION: &str = "request_duration_seconds";
/// Label of `RESPONSES` with values `1xx` … `5xx`.
pub const CODE_CLASS: &str = "code_class";

/// `proxyfleet_responses_total`, as exposed.
pub const RESPONSES_TOTAL: &str = "proxyfleet_responses_total";
/// `proxyfleet_request_duration_seconds_bucket`, as exposed.
pub const REQUEST_DURATION_BUCKET: &str = "proxyfleet_request_duration_seconds_bucket";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposed_names_are_the_registered_ones() {
        assert_eq!(RESPONSES_TOTAL, format!("{PREFIX}_{RESPONSES}_total"));
        assert_eq!(REQUEST_DURATION_BUCKET, format!("{PREFIX}_{REQUEST_DURATION}_bucket"));
    }
}
