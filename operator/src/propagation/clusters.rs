//! Member clusters, read from Secrets: ours (label `proxyfleet.io/cluster`, key `kubeconfig`) and
//! Argo CD's (`argocd.argoproj.io/secret-type: cluster`, keys `name`, `server`, `config`).
//!
//! Credentials must be inline. A kubeconfig that runs a command (`exec`, `auth-provider`) or reads
//! a file (`tokenFile`, `client-certificate`, `certificate-authority`) is refused: whoever can
//! write a Secret in the clusters namespace must not be able to run code in, or read files of,
//! the operator's pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::config::Kubeconfig;
use serde::Deserialize;

/// Label that registers a Secret of ours as a member cluster.
pub const CLUSTER_LABEL: &str = "proxyfleet.io/cluster";
/// Annotation on a cluster Secret: the hub namespaces whose fleets may be placed onto that
/// cluster, comma-separated, or `*` for all. Absent or empty: none (deny by default). Only the
/// platform team, who may write Secrets in the clusters namespace, opens a cluster to a team.
pub const ALLOWED_NAMESPACES: &str = "proxyfleet.io/allowed-namespaces";
/// Argo CD's label for its cluster Secrets.
pub const ARGOCD_SECRET_TYPE: &str = "argocd.argoproj.io/secret-type";

/// One registered member cluster.
#[derive(Clone, Debug)]
pub struct MemberCluster {
    pub name: String,
    /// The labels of its Secret, matched by `placement.clusterSelector`.
    pub labels: BTreeMap<String, String>,
    /// `namespace/name` of the Secret, for messages.
    pub secret: String,
    /// Changes whenever the Secret does: cached clients are rebuilt on change.
    pub secret_version: String,
    pub kubeconfig: Result<Kubeconfig, String>,
    /// Hub namespaces admitted (`ALLOWED_NAMESPACES`); `["*"]` admits all.
    pub allowed_namespaces: Vec<String>,
}

impl MemberCluster {
    /// Whether fleets of hub namespace `namespace` may be placed here.
    pub fn admits(&self, namespace: &str) -> bool {
        self.allowed_namespaces.iter().any(|n| n == "*" || n == namespace)
    }
}

fn allowed_namespaces(secret: &Secret) -> Vec<String> {
    let annotations = secret.metadata.annotations.as_ref();
    let Some(list) = annotations.and_then(|a| a.get(ALLOWED_NAMESPACES)) else {
        return Vec::new();
    };
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect()
}

fn data(secret: &Secret, key: &str) -> Option<String> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return String::from_utf8(v.0.clone()).ok();
    }
    secret.string_data.as_ref().and_then(|d| d.get(key)).cloned()
}

fn secret_ref(secret: &Secret) -> String {
    format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Reads a member cluster from a Secret of either format; `None` when it is neither.
pub fn from_secret(secret: &Secret) -> Option<MemberCluster> {
    let labels = secret.metadata.labels.clone().unwrap_or_default();
    let argocd = labels.get(ARGOCD_SECRET_TYPE).map(String::as_str) == Some("cluster");
    if !argocd && !labels.contains_key(CLUSTER_LABEL) {
        return None;
    }
    let secret_name = secret.metadata.name.clone().unwrap_or_default();
    let name = data(secret, "name")
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or(secret_name);
    let kubeconfig = if argocd {
        argocd_kubeconfig(secret)
    } else {
        match data(secret, "kubeconfig") {
            None => Err("has no `kubeconfig` key".to_string()),
            Some(text) => Kubeconfig::from_yaml(&text).map_err(|e| format!("`kubeconfig` does not parse: {e}")),
        }
    }
    .and_then(inline_only)
    .map_err(|e| format!("cluster Secret {}: {e}", secret_ref(secret)));
    Some(MemberCluster {
        name,
        labels,
        secret: secret_ref(secret),
        secret_version: secret.metadata.resource_version.clone().unwrap_or_default(),
        kubeconfig,
        allowed_namespaces: allowed_namespaces(secret),
    })
}

/// Argo CD's `config` key (a subset: bearer token, basic auth, TLS client config).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ArgoClusterConfig {
    bearer_token: Option<String>,
    username: Option<String>,
    password: Option<String>,
    #[serde(default)]
    tls_client_config: ArgoTlsClientConfig,
    exec_provider_config: Option<serde_json::Value>,
    aws_auth_config: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ArgoTlsClientConfig {
    #[serde(default)]
    insecure: bool,
    server_name: Option<String>,
    ca_data: Option<String>,
    cert_data: Option<String>,
    key_data: Option<String>,
}

fn argocd_kubeconfig(secret: &Secret) -> Result<Kubeconfig, String> {
    let server = data(secret, "server").ok_or("has no `server` key")?;
    let config: ArgoClusterConfig = match data(secret, "config") {
        Some(text) => serde_json::from_str(&text).map_err(|e| format!("`config` is not Argo CD cluster JSON: {e}"))?,
        None => ArgoClusterConfig::default(),
    };
    if config.exec_provider_config.is_some() || config.aws_auth_config.is_some() {
        return Err("uses execProviderConfig/awsAuthConfig; only inline credentials are accepted".into());
    }
    let tls = config.tls_client_config;
    let kubeconfig = serde_json::json!({
        "clusters": [{"name": "member", "cluster": {
            "server": server.trim(),
            "certificate-authority-data": tls.ca_data,
            "insecure-skip-tls-verify": tls.insecure.then_some(true),
            "tls-server-name": tls.server_name,
        }}],
        "users": [{"name": "member", "user": {
            "token": config.bearer_token,
            "username": config.username,
            "password": config.password,
            "client-certificate-data": tls.cert_data,
            "client-key-data": tls.key_data,
        }}],
        "contexts": [{"name": "member", "context": {"cluster": "member", "user": "member"}}],
        "current-context": "member",
    });
    serde_json::from_value(strip_nulls(kubeconfig)).map_err(|e| format!("cannot build a client config: {e}"))
}

fn strip_nulls(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        serde_json::Value::Array(a) => serde_json::Value::Array(a.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

/// Refuses credentials that run commands or read files of the operator's pod.
fn inline_only(kubeconfig: Kubeconfig) -> Result<Kubeconfig, String> {
    for named in &kubeconfig.auth_infos {
        let Some(user) = &named.auth_info else { continue };
        let refused = [
            (user.exec.is_some(), "exec"),
            (user.auth_provider.is_some(), "auth-provider"),
            (user.token_file.is_some(), "tokenFile"),
            (user.client_certificate.is_some(), "client-certificate"),
            (user.client_key.is_some(), "client-key"),
        ];
        if let Some((_, field)) = refused.iter().find(|(bad, _)| *bad) {
            return Err(format!(
                "user {:?} uses `{field}`; only inline credentials (token, client-certificate-data) are accepted",
                named.name
            ));
        }
    }
    for named in &kubeconfig.clusters {
        if named
            .cluster
            .as_ref()
            .is_some_and(|c| c.certificate_authority.is_some())
        {
            return Err(format!(
                "cluster {:?} uses `certificate-authority` (a file); use certificate-authority-data",
                named.name
            ));
        }
    }
    if kubeconfig.clusters.is_empty() {
        return Err("kubeconfig names no cluster".into());
    }
    Ok(kubeconfig)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::ByteString;

    fn secret(labels: &[(&str, &str)], data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("s1".into()),
                namespace: Some("proxyfleet-system".into()),
                resource_version: Some("7".into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
clusters: [{name: m, cluster: {server: "https://10.0.0.1:6443", certificate-authority-data: "Zm9v"}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: c, context: {cluster: m, user: u}}]
current-context: c
"#;

    #[test]
    fn unlabelled_secrets_are_not_clusters() {
        assert!(from_secret(&secret(&[], &[("kubeconfig", KUBECONFIG)])).is_none());
    }

    #[test]
    fn our_format_names_the_cluster_by_secret_or_name_key() {
        let c = from_secret(&secret(
            &[(CLUSTER_LABEL, "true"), ("region", "eu")],
            &[("kubeconfig", KUBECONFIG)],
        ))
        .unwrap();
        assert_eq!(c.name, "s1");
        assert_eq!(c.labels.get("region").unwrap(), "eu");
        assert!(c.kubeconfig.is_ok());
        let c = from_secret(&secret(
            &[(CLUSTER_LABEL, "")],
            &[("kubeconfig", KUBECONFIG), ("name", "eu-1")],
        ))
        .unwrap();
        assert_eq!(c.name, "eu-1");
    }

    #[test]
    fn argocd_format_is_accepted() {
        let config = r#"{"bearerToken":"t","tlsClientConfig":{"insecure":false,"caData":"Zm9v"}}"#;
        let c = from_secret(&secret(
            &[(ARGOCD_SECRET_TYPE, "cluster")],
            &[
                ("name", "us-1"),
                ("server", "https://10.0.0.2:6443"),
                ("config", config),
            ],
        ))
        .unwrap();
        assert_eq!(c.name, "us-1");
        let k = c.kubeconfig.unwrap();
        let cluster = k.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.2:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Zm9v"));
        assert!(k.auth_infos[0].auth_info.as_ref().unwrap().token.is_some());
    }

    #[test]
    fn commands_and_files_are_refused_naming_the_field() {
        let exec = KUBECONFIG.replace(
            "{token: abc}",
            "{exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}}",
        );
        let c = from_secret(&secret(&[(CLUSTER_LABEL, "")], &[("kubeconfig", &exec)])).unwrap();
        let e = c.kubeconfig.unwrap_err();
        assert!(e.contains("`exec`") && e.contains("proxyfleet-system/s1"), "{e}");
        let file = KUBECONFIG.replace(
            "{token: abc}",
            "{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}",
        );
        let e = from_secret(&secret(&[(CLUSTER_LABEL, "")], &[("kubeconfig", &file)]))
            .unwrap()
            .kubeconfig
            .unwrap_err();
        assert!(e.contains("tokenFile"), "{e}");
        let argo = from_secret(&secret(
            &[(ARGOCD_SECRET_TYPE, "cluster")],
            &[
                ("server", "https://x"),
                ("config", r#"{"execProviderConfig":{"command":"x"}}"#),
            ],
        ))
        .unwrap();
        assert!(argo.kubeconfig.unwrap_err().contains("execProviderConfig"));
    }

    #[test]
    fn a_cluster_admits_only_the_namespaces_its_secret_lists() {
        let mut s = secret(&[(CLUSTER_LABEL, "")], &[("kubeconfig", KUBECONFIG)]);
        let c = from_secret(&s).unwrap();
        assert!(!c.admits("team-a"), "deny by default");
        s.metadata.annotations = Some([(ALLOWED_NAMESPACES.to_string(), " team-a, team-b ,".to_string())].into());
        let c = from_secret(&s).unwrap();
        assert!(c.admits("team-a") && c.admits("team-b") && !c.admits("team-c"));
        s.metadata.annotations = Some([(ALLOWED_NAMESPACES.to_string(), "*".to_string())].into());
        assert!(from_secret(&s).unwrap().admits("anyone"));
    }

    #[test]
    fn a_missing_kubeconfig_is_reported() {
        let c = from_secret(&secret(&[(CLUSTER_LABEL, "")], &[])).unwrap();
        assert!(c.kubeconfig.unwrap_err().contains("no `kubeconfig` key"));
    }
}
