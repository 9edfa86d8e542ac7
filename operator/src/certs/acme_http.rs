//! The ACME client's HTTPS: hyper over rustls with ring (the operator's one TLS stack),
//! trusting the public roots (webpki-roots: the operator image has no system store) and, for
//! a private ACME server, the CA the fleet names. instant-acme's own client would pull
//! aws-lc-rs and the platform verifier.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};
use rustls::pki_types::{pem::PemObject, CertificateDer};

/// One request's limit: an ACME server that hangs fails the order, it does not hold it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub struct AcmeHttp(Client<hyper_rustls::HttpsConnector<HttpConnector>, BodyWrapper<Bytes>>);

#[derive(Debug, thiserror::Error)]
pub enum AcmeHttpError {
    #[error("spec.tls.acme.directoryCaSecret: ca.crt holds no usable PEM certificate: {0}")]
    BadCa(String),
    #[error("building the TLS client for the ACME directory: {0}")]
    Tls(#[from] rustls::Error),
}

impl AcmeHttp {
    pub fn new(extra_ca_pem: Option<&str>) -> Result<Self, AcmeHttpError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(pem) = extra_ca_pem {
            let mut added = 0;
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| AcmeHttpError::BadCa(e.to_string()))?;
                roots.add(cert).map_err(|e| AcmeHttpError::BadCa(e.to_string()))?;
                added += 1;
            }
            if added == 0 {
                return Err(AcmeHttpError::BadCa("no CERTIFICATE block".into()));
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        Ok(Self(Client::builder(TokioExecutor::new()).build(https)))
    }
}

impl HttpClient for AcmeHttp {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let fut = self.0.request(req);
        Box::pin(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
                Ok(Ok(rsp)) => Ok(BytesResponse::from(rsp)),
                Ok(Err(e)) => Err(instant_acme::Error::Other(Box::new(e))),
                Err(_) => Err(instant_acme::Error::Str("the ACME server did not answer within 30 s")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_ca_without_certificates() {
        assert!(matches!(AcmeHttp::new(Some("not pem")), Err(AcmeHttpError::BadCa(_))));
        assert!(AcmeHttp::new(None).is_ok());
    }
}
