//! `google.api.http` path templates (`/v1/{name=shelves/*}/books/{book}:publish`): parsed
//! once, matched against request paths, capturing the variables' values.

/// One segment of a template.
#[derive(Clone, Debug, PartialEq)]
enum Segment {
    Literal(String),
    /// `*`: exactly one segment.
    One,
    /// `**`: the rest of the path (last only).
    Rest,
}

/// A parsed template: its segments, the variables that capture ranges of them, and the verb.
#[derive(Clone, Debug, PartialEq)]
pub struct PathTemplate {
    segments: Vec<Segment>,
    /// (field path, first segment, segment count; `None`: to the end).
    variables: Vec<(String, usize, Option<usize>)>,
    verb: Option<String>,
}

#[derive(Debug, PartialEq, thiserror::Error)]
#[error("path template {template:?}: {why}")]
pub struct TemplateError {
    pub template: String,
    pub why: &'static str,
}

fn is_field_path(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

impl PathTemplate {
    pub fn parse(template: &str) -> Result<Self, TemplateError> {
        let fail = |why| TemplateError {
            template: template.to_string(),
            why,
        };
        let rest = template.strip_prefix('/').ok_or_else(|| fail("must start with /"))?;
        // The verb follows the last ':' outside braces.
        let (path, verb) = match rest.rfind(':') {
            Some(i) if !rest[i..].contains('}') => (&rest[..i], Some(rest[i + 1..].to_string())),
            _ => (rest, None),
        };
        let mut t = PathTemplate {
            segments: Vec::new(),
            variables: Vec::new(),
            verb,
        };
        let mut chars = path;
        while !chars.is_empty() {
            if let Some(inner) = chars.strip_prefix('{') {
                let end = inner.find('}').ok_or_else(|| fail("unclosed {"))?;
                let (field, pattern) = match inner[..end].split_once('=') {
                    Some((f, p)) => (f, p),
                    None => (&inner[..end], "*"),
                };
                if !is_field_path(field) {
                    return Err(fail("a variable must name a field path"));
                }
                let first = t.segments.len();
                for s in pattern.split('/') {
                    t.push_segment(s).map_err(fail)?;
                }
                let count = (!t.segments.contains(&Segment::Rest)).then(|| t.segments.len() - first);
                t.variables.push((field.to_string(), first, count));
                chars = &inner[end + 1..];
            } else {
                let end = chars.find('/').unwrap_or(chars.len());
                t.push_segment(&chars[..end]).map_err(fail)?;
                chars = &chars[end..];
            }
            chars = match chars.strip_prefix('/') {
                Some(rest) if !rest.is_empty() => rest,
                Some(_) => return Err(fail("a trailing / is not allowed")),
                None if chars.is_empty() => chars,
                None => return Err(fail("a variable must be a whole segment")),
            };
        }
        Ok(t)
    }

    /// Whether the template ends with a `:verb`.
    pub fn has_verb(&self) -> bool {
        self.verb.is_some()
    }

    fn push_segment(&mut self, s: &str) -> Result<(), &'static str> {
        if self.segments.last() == Some(&Segment::Rest) {
            return Err("** must be the last segment");
        }
        self.segments.push(match s {
            "" => return Err("empty segment"),
            "*" => Segment::One,
            "**" => Segment::Rest,
            lit if lit.contains(['{', '}', '*']) => return Err("bad literal"),
            lit => Segment::Literal(lit.to_string()),
        });
        Ok(())
    }

    /// The variables' (field path, value) when `path` matches; values percent-decoded.
    pub fn matches(&self, path: &str) -> Option<Vec<(String, String)>> {
        let rest = path.strip_prefix('/')?;
        let rest = match &self.verb {
            Some(v) => rest.strip_suffix(v.as_str())?.strip_suffix(':')?,
            None => rest,
        };
        let parts: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        let fixed = self.segments.iter().filter(|s| **s != Segment::Rest).count();
        let has_rest = self.segments.last() == Some(&Segment::Rest);
        if parts.len() < fixed || (!has_rest && parts.len() != fixed) {
            return None;
        }
        for (seg, part) in self.segments.iter().zip(&parts) {
            match seg {
                Segment::Literal(l) if l != part => return None,
                Segment::One if part.is_empty() => return None,
                _ => {}
            }
        }
        let mut out = Vec::with_capacity(self.variables.len());
        for (field, first, count) in &self.variables {
            let end = count.map_or(parts.len(), |c| first + c);
            let raw = parts.get(*first..end)?.join("/");
            out.push((field.clone(), percent_decode(&raw)?));
        }
        Some(out)
    }
}

/// `%XX` escapes decoded; `None` for a bad escape or invalid UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(t: &str, path: &str) -> Option<Vec<(String, String)>> {
        PathTemplate::parse(t).unwrap().matches(path)
    }

    #[test]
    fn variables_literals_wildcards_and_verbs() {
        assert_eq!(
            vars("/v1/health/{service}", "/v1/health/app"),
            Some(vec![("service".into(), "app".into())])
        );
        assert_eq!(vars("/v1/health/{service}", "/v1/health/a/b"), None);
        assert_eq!(
            vars("/v1/{name=shelves/*/books/*}", "/v1/shelves/1/books/2"),
            Some(vec![("name".into(), "shelves/1/books/2".into())])
        );
        assert_eq!(vars("/v1/{name=shelves/*}", "/v1/books/1"), None);
        assert_eq!(
            vars("/v1/{a.b}/x/{c=**}", "/v1/p%20q/x/r/s"),
            Some(vec![("a.b".into(), "p q".into()), ("c".into(), "r/s".into())])
        );
        assert_eq!(vars("/v1/items:batchGet", "/v1/items:batchGet"), Some(vec![]));
        assert_eq!(vars("/v1/items:batchGet", "/v1/items"), None);
        assert_eq!(
            vars("/v1/{id}:cancel", "/v1/42:cancel"),
            Some(vec![("id".into(), "42".into())])
        );
        assert_eq!(vars("/v1/*/x", "/v1/any/x"), Some(vec![]));
        assert_eq!(vars("/v1/{id}", "/v1/%zz"), None);
    }

    #[test]
    fn bad_templates_are_refused() {
        for t in [
            "v1/x",
            "/v1/{id",
            "/v1/**/x",
            "/v1/{a-b}",
            "/v1//x",
            "/v1/x/",
            "/v1/a{id}",
        ] {
            assert!(PathTemplate::parse(t).is_err(), "{t}");
        }
    }
}
