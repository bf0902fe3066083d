//! The runtime's three lists as the inventory reads them, every refresh: only the fields it
//! uses are decoded. prost skips the other fields of a message without allocating for them,
//! labels and annotations included, which the kubelet copies from every pod onto its sandbox
//! and containers. Decoded whole, a 250-pod node's lists were the peak of `evictd-io`'s malloc
//! arena, and a thread arena keeps its peak under `mlockall` (glibc's `MADV_DONTNEED` fails on
//! locked pages). The field numbers are the CRI's (`runtime.v1`, api.proto).

use tonic::codegen::http::uri::PathAndQuery;

use super::{CriClient, CriError, MAX_MESSAGE_BYTES, cri, deadline};

/// `ListPodSandboxResponse`, each sandbox without its labels and annotations (a new
/// sandbox's annotations come from its PodSandboxStatus).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sandboxes {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<Sandbox>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<cri::PodSandboxMetadata>,
    #[prost(enumeration = "cri::PodSandboxState", tag = "3")]
    pub state: i32,
}

/// `ListContainersResponse`, each container without its image, labels and annotations (a
/// new container's annotations come from its ContainerStatus).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Containers {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<cri::ContainerMetadata>,
    #[prost(enumeration = "cri::ContainerState", tag = "6")]
    pub state: i32,
}

/// `ListContainerStatsResponse`: each container's id and writable layer only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Layers {
    #[prost(message, repeated, tag = "1")]
    pub stats: Vec<Layer>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Layer {
    #[prost(message, optional, tag = "1")]
    pub attributes: Option<Attributes>,
    #[prost(message, optional, tag = "4")]
    pub writable_layer: Option<cri::FilesystemUsage>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Attributes {
    #[prost(string, tag = "1")]
    pub id: String,
}

impl CriClient {
    pub async fn inventory_sandboxes(&self) -> Result<Vec<Sandbox>, CriError> {
        let req = cri::ListPodSandboxRequest::default();
        Ok(self
            .slim::<_, Sandboxes>("ListPodSandbox", "/runtime.v1.RuntimeService/ListPodSandbox", req)
            .await?
            .items)
    }

    pub async fn inventory_containers(&self) -> Result<Vec<Container>, CriError> {
        let req = cri::ListContainersRequest::default();
        let path = "/runtime.v1.RuntimeService/ListContainers";
        Ok(self.slim::<_, Containers>("ListContainers", path, req).await?.containers)
    }

    pub async fn writable_layers(&self) -> Result<Vec<Layer>, CriError> {
        let req = cri::ListContainerStatsRequest::default();
        let path = "/runtime.v1.RuntimeService/ListContainerStats";
        Ok(self.slim::<_, Layers>("ListContainerStats", path, req).await?.stats)
    }

    /// One unary call on the runtime's channel, its answer decoded as `Resp`.
    async fn slim<Req, Resp>(
        &self,
        call: &'static str,
        path: &'static str,
        req: Req,
    ) -> Result<Resp, CriError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc =
            tonic::client::Grpc::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES);
        let answer = async move {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(format!("service was not ready: {e}")))?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(deadline(req, self.timeout), PathAndQuery::from_static(path), codec).await
        };
        self.call(call, self.timeout, answer).await
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    /// A full answer, labels and annotations included, decodes into the slim messages with
    /// every field the inventory reads: the field numbers are the CRI's.
    #[test]
    fn the_slim_lists_read_the_fields_of_the_full_ones() {
        let labels = || [("io.kubernetes.pod.name".to_owned(), "p".to_owned())].into_iter().collect();
        let sandbox = cri::PodSandbox {
            id: "sb".into(),
            metadata: Some(cri::PodSandboxMetadata {
                name: "p".into(),
                uid: "u".into(),
                namespace: "n".into(),
                attempt: 1,
            }),
            state: cri::PodSandboxState::SandboxReady as i32,
            created_at: 5,
            labels: labels(),
            annotations: labels(),
            runtime_handler: "runc".into(),
        };
        let full = cri::ListPodSandboxResponse { items: vec![sandbox] }.encode_to_vec();
        let slim = Sandboxes::decode(full.as_slice()).unwrap();
        assert_eq!(slim.items[0].id, "sb");
        assert_eq!(slim.items[0].metadata.as_ref().unwrap().uid, "u");
        assert_eq!(slim.items[0].state, cri::PodSandboxState::SandboxReady as i32);

        let container = cri::Container {
            id: "c".into(),
            pod_sandbox_id: "sb".into(),
            metadata: Some(cri::ContainerMetadata { name: "app".into(), attempt: 2 }),
            image: Some(cri::ImageSpec { image: "img".into(), ..Default::default() }),
            image_ref: "ref".into(),
            state: cri::ContainerState::ContainerRunning as i32,
            created_at: 5,
            labels: labels(),
            annotations: labels(),
            image_id: "id".into(),
        };
        let full = cri::ListContainersResponse { containers: vec![container] }.encode_to_vec();
        let slim = Containers::decode(full.as_slice()).unwrap();
        let c = &slim.containers[0];
        assert_eq!((c.id.as_str(), c.pod_sandbox_id.as_str()), ("c", "sb"));
        assert_eq!(c.metadata.as_ref().map(|m| (m.name.as_str(), m.attempt)), Some(("app", 2)));
        assert_eq!(c.state, cri::ContainerState::ContainerRunning as i32);

        let stats = cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: "c".into(),
                labels: labels(),
                ..Default::default()
            }),
            cpu: Some(cri::CpuUsage { timestamp: 1, ..Default::default() }),
            writable_layer: Some(cri::FilesystemUsage {
                used_bytes: Some(cri::UInt64Value { value: 4096 }),
                inodes_used: Some(cri::UInt64Value { value: 3 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let full = cri::ListContainerStatsResponse { stats: vec![stats] }.encode_to_vec();
        let slim = Layers::decode(full.as_slice()).unwrap();
        assert_eq!(slim.stats[0].attributes.as_ref().unwrap().id, "c");
        let layer = slim.stats[0].writable_layer.as_ref().unwrap();
        assert_eq!(
            (layer.used_bytes.map(|v| v.value), layer.inodes_used.map(|v| v.value)),
            (Some(4096), Some(3))
        );
    }
}
