//! The API client: from a kubeconfig file, or, inside a pod, from its service account. No
//! request is made here, so an API server that is down does not hold up the start.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

/// Where the API server and credentials come from.
#[derive(Clone, Debug)]
pub enum ApiSource {
    /// `--kubeconfig FILE`, read once (`ApiSource::kubeconfig`).
    Kubeconfig { path: PathBuf, file: Box<Kubeconfig> },
    /// The pod's service account (`KUBERNETES_SERVICE_HOST`, the mounted token and CA).
    InCluster,
}

#[derive(Clone, Debug)]
pub struct ApiOptions {
    pub source: ApiSource,
    /// The node evictd runs on (`--node-name`, `NODE_NAME`): its events and conditions.
    pub node_name: String,
    /// Deadline of one API request (connect, read, write each).
    pub timeout: Duration,
    /// How evictd's taints keep pods off the node while its conditions are true.
    pub taint_effect: super::taints::TaintEffect,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("--kubeconfig {}: {source}", path.display())]
    Kubeconfig { path: PathBuf, source: kube::config::KubeconfigError },
    #[error("in-cluster API configuration (the pod's service account): {0}")]
    InCluster(#[from] kube::config::InClusterError),
    #[error("building the API client: {0}")]
    Client(#[from] kube::Error),
}

impl ApiSource {
    /// Reads the kubeconfig at `path`, so that a bad file stops the start naming it.
    pub fn kubeconfig(path: &Path) -> Result<Self, ConnectError> {
        let file = Kubeconfig::read_from(path)
            .map_err(|source| ConnectError::Kubeconfig { path: path.to_owned(), source })?;
        Ok(ApiSource::Kubeconfig { path: path.to_owned(), file: Box::new(file) })
    }
}

/// Whether this process runs in a pod whose service account can reach the API server.
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}

/// The client for requests: each connect, read and write bounded by `opts.timeout`.
pub async fn client(opts: &ApiOptions) -> Result<Client, ConnectError> {
    let mut config = config(opts).await?;
    config.read_timeout = Some(opts.timeout);
    Ok(Client::try_from(config)?)
}

/// The client for watches. A watch on a quiet cluster reads nothing for minutes (the server
/// ends it itself after its `timeoutSeconds`); a read deadline would tear it down after
/// every quiet `opts.timeout` and list all the node's pods again.
pub async fn watch_client(opts: &ApiOptions) -> Result<Client, ConnectError> {
    let mut config = config(opts).await?;
    config.read_timeout = None;
    Ok(Client::try_from(config)?)
}

async fn config(opts: &ApiOptions) -> Result<Config, ConnectError> {
    let mut config = match &opts.source {
        ApiSource::Kubeconfig { path, file } => {
            Config::from_custom_kubeconfig((**file).clone(), &KubeConfigOptions::default())
                .await
                .map_err(|source| ConnectError::Kubeconfig { path: path.clone(), source })?
        }
        ApiSource::InCluster => Config::incluster()?,
    };
    config.connect_timeout = Some(opts.timeout);
    config.write_timeout = Some(opts.timeout);
    Ok(config)
}
