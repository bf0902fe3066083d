fn main() -> anyhow::Result<()> {
    aya_build::emit_bpf_target_arch_cfg().map_err(|e| anyhow::anyhow!("evictd-ebpf build script: {e:#}"))
}
