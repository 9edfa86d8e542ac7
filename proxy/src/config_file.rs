//! Reading the proxy's YAML configuration file.

use proxyfleet_config::ProxyConfig;

#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("reading configuration {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("configuration {path}: {source}")]
    Parse {
        path: String,
        source: proxyfleet_config::ConfigError,
    },
}

pub fn read_config(path: &std::path::Path) -> Result<ProxyConfig, ConfigFileError> {
    let display = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: display.clone(),
        source,
    })?;
    ProxyConfig::from_yaml(&text).map_err(|source| ConfigFileError::Parse { path: display, source })
}
