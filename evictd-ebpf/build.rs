fn main() {
    if let Err(e) = aya_build::emit_bpf_target_arch_cfg() {
        panic!("evictd-ebpf build script: {e:#}");
    }
}
