//! The HTTP bindings of a descriptor set: each method's `google.api.http` rule (and its
//! `additional_bindings`), with its path template parsed.

use prost_reflect::{DescriptorPool, DynamicMessage, MethodDescriptor};

use super::template::{PathTemplate, TemplateError};

/// Where the request body goes: nowhere, the whole message (`*`), or one field.
#[derive(Clone, Debug, PartialEq)]
pub enum BodyTarget {
    None,
    Whole,
    Field(String),
}

/// One HTTP binding of one gRPC method.
#[derive(Clone, Debug)]
pub struct Binding {
    pub method: MethodDescriptor,
    pub verb: http::Method,
    pub template: PathTemplate,
    pub body: BodyTarget,
    /// The response field to answer with instead of the whole message.
    pub response_body: Option<String>,
    /// `/pkg.Service/Method`, the gRPC request path.
    pub grpc_path: http::uri::PathAndQuery,
}

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("the descriptor set is not a FileDescriptorSet: {0}")]
    Decode(#[from] prost_reflect::DescriptorError),
    #[error("service {0} is not in the descriptor set")]
    UnknownService(String),
    #[error("the descriptor set lacks google/api/annotations.proto (compile with --include_imports)")]
    NoAnnotations,
    #[error("{method}: {source}")]
    Template { method: String, source: TemplateError },
    #[error("{method}: {why}")]
    Rule { method: String, why: String },
}

/// Every binding of the chosen services (all of the set when `services` is empty).
pub fn bindings(descriptor_set: &[u8], services: &[String]) -> Result<Vec<Binding>, BindError> {
    let pool = DescriptorPool::decode(descriptor_set)?;
    let http = pool
        .get_extension_by_name("google.api.http")
        .ok_or(BindError::NoAnnotations)?;
    let chosen: Vec<_> = if services.is_empty() {
        pool.services().collect()
    } else {
        services
            .iter()
            .map(|s| {
                pool.get_service_by_name(s)
                    .ok_or_else(|| BindError::UnknownService(s.clone()))
            })
            .collect::<Result<_, _>>()?
    };
    let mut out = Vec::new();
    for method in chosen.iter().flat_map(|s| s.methods()) {
        let options = method.options();
        if !options.has_extension(&http) {
            continue;
        }
        let rule = options.get_extension(&http);
        let Some(rule) = rule.as_message() else { continue };
        push_rule(&method, rule, &mut out)?;
        if let Some(more) = rule.get_field_by_name("additional_bindings") {
            for extra in more.as_list().unwrap_or_default() {
                if let Some(extra) = extra.as_message() {
                    push_rule(&method, extra, &mut out)?;
                }
            }
        }
    }
    Ok(out)
}

fn text(rule: &DynamicMessage, field: &str) -> Option<String> {
    rule.has_field_by_name(field)
        .then(|| rule.get_field_by_name(field)?.as_str().map(str::to_string))
        .flatten()
        .filter(|s| !s.is_empty())
}

/// The verb and path of a rule: `get`..`patch`, or `custom {kind, path}`.
fn verb_and_path(rule: &DynamicMessage) -> Option<(http::Method, String)> {
    for (field, verb) in [
        ("get", http::Method::GET),
        ("put", http::Method::PUT),
        ("post", http::Method::POST),
        ("delete", http::Method::DELETE),
        ("patch", http::Method::PATCH),
    ] {
        if let Some(path) = text(rule, field) {
            return Some((verb, path));
        }
    }
    let custom = rule.get_field_by_name("custom")?;
    let custom = custom.as_message()?;
    let verb = http::Method::from_bytes(text(custom, "kind")?.as_bytes()).ok()?;
    Some((verb, text(custom, "path")?))
}

fn push_rule(method: &MethodDescriptor, rule: &DynamicMessage, out: &mut Vec<Binding>) -> Result<(), BindError> {
    let name = method.full_name().to_string();
    let rule_error = |why: String| BindError::Rule {
        method: name.clone(),
        why,
    };
    let (verb, path) = verb_and_path(rule).ok_or_else(|| rule_error("the http rule has no pattern".into()))?;
    let template = PathTemplate::parse(&path).map_err(|source| BindError::Template {
        method: name.clone(),
        source,
    })?;
    let body = match text(rule, "body").as_deref() {
        None => BodyTarget::None,
        Some("*") => BodyTarget::Whole,
        Some(f) => {
            if method.input().get_field_by_name(f).is_none() {
                return Err(rule_error(format!(
                    "body names {f}, not a field of {}",
                    method.input().full_name()
                )));
            }
            BodyTarget::Field(f.to_string())
        }
    };
    let grpc_path = format!("/{}/{}", method.parent_service().full_name(), method.name())
        .parse()
        .map_err(|_| rule_error("the method's name is not a path".into()))?;
    out.push(Binding {
        method: method.clone(),
        verb,
        template,
        body,
        response_body: text(rule, "response_body"),
        grpc_path,
    });
    Ok(())
}
