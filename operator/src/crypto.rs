//! The operator's TLS crypto provider. rustls picks a process-wide default only when exactly one
//! provider is compiled in; built in one workspace with the proxy (which enables aws-lc-rs, see
//! docs/decisions.md), rustls has both, and kube's client would panic building its TLS config.
//! Every binary that talks to the API server installs ring, the operator's provider, first.

/// Installs ring as the process-wide rustls provider, unless one is installed already.
pub fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err means another thread installed one in between: fine, there is one.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_provider_is_installed_and_a_second_call_is_harmless() {
        super::install_provider();
        super::install_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
    }

    #[tokio::test]
    async fn a_kube_client_builds_its_tls_config() {
        super::install_provider();
        let kubeconfig: kube::config::Kubeconfig = serde_yaml::from_str(
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: x}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        )
        .unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap();
    }
}
