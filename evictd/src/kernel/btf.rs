//! What the raw-tracepoint programs need from the running kernel's BTF: the tracepoints'
//! prototypes (checked, so a kernel whose arguments differ is refused) and the struct
//! offsets from a `struct mem_cgroup *` to its cgroup id (never compiled in).

use std::path::Path;

use btf_rs::{Btf, Type};

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading kernel BTF {path}: {reason}")]
    Btf { path: String, reason: String },
    #[error("kernel BTF: {0}")]
    Mismatch(String),
}

/// Byte offsets of mem_cgroup.css + cgroup_subsys_state.cgroup, cgroup.kn, kernfs_node.id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemcgIdPath {
    pub memcg_cgroup_off: u32,
    pub cgroup_kn_off: u32,
    pub kn_id_off: u32,
}

/// Byte offsets the batched charge hook follows (see `KernelConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPath {
    pub memcg_css_off: u32,
    pub memcg_memory_off: u32,
    pub counter_usage_off: u32,
    pub counter_parent_off: u32,
    pub cgroup_memory_css_off: u32,
}

pub struct KernelBtf {
    btf: Btf,
    path: String,
}

impl KernelBtf {
    pub fn open(path: &Path) -> Result<Self, BtfError> {
        let p = path.display().to_string();
        // Mmap keeps the daemon's RSS small: the parsed vmlinux BTF would cost tens of MiB.
        // Kernels before 6.15 cannot mmap /sys/kernel/btf/vmlinux (ENODEV, seen on Debian's
        // 6.1 and 6.12 in the VM matrix): there it is read and parsed, and freed with this
        // value once the programs are loaded.
        let btf = Btf::from_file_with_backend(path, btf_rs::Backend::Mmap)
            .or_else(|_| Btf::from_file_with_backend(path, btf_rs::Backend::Cache))
            .map_err(|e| BtfError::Btf { path: p.clone(), reason: e.to_string() })?;
        Ok(KernelBtf { btf, path: p })
    }

    fn err(&self, e: btf_rs::Error) -> BtfError {
        BtfError::Btf { path: self.path.clone(), reason: e.to_string() }
    }

    fn name_of(&self, t: &Type) -> Option<String> {
        match t {
            Type::Struct(s) => self.btf.resolve_name(s).ok(),
            Type::Int(i) => self.btf.resolve_name(i).ok(),
            _ => None,
        }
    }

    /// The members of an enum, by name and value.
    pub fn enum_members(&self, name: &str) -> Result<Vec<(String, u32)>, BtfError> {
        let mut out = Vec::new();
        for t in self.btf.resolve_types_by_name(name).map_err(|e| self.err(e))? {
            if let Type::Enum(e) = t {
                for m in &e.members {
                    out.push((self.btf.resolve_name(m).map_err(|e| self.err(e))?, m.val()));
                }
            }
        }
        Ok(out)
    }

    /// A member's byte offset in a struct.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        for t in self.btf.resolve_types_by_name(strukt).map_err(|e| self.err(e))? {
            let Type::Struct(s) = t else { continue };
            for m in &s.members {
                if self.btf.resolve_name(m).is_ok_and(|n| n == member) {
                    return Ok(m.bit_offset() / 8);
                }
            }
        }
        Err(BtfError::Mismatch(format!("struct {strukt} has no member {member}")))
    }

    pub fn memcg_id_path(&self) -> Result<MemcgIdPath, BtfError> {
        Ok(MemcgIdPath {
            memcg_cgroup_off: self.member_offset("mem_cgroup", "css")?
                + self.member_offset("cgroup_subsys_state", "cgroup")?,
            cgroup_kn_off: self.member_offset("cgroup", "kn")?,
            kn_id_off: self.member_offset("kernfs_node", "id")?,
        })
    }

    /// From a page counter to its memcg and back through the cgroup's memory css: offsets
    /// that differ between 6.1 and 7.x (toolchain notes), so never compiled in.
    pub fn batch_path(&self) -> Result<BatchPath, BtfError> {
        let memory_id = self
            .enum_members("cgroup_subsys_id")?
            .into_iter()
            .find_map(|(name, value)| (name == "memory_cgrp_id").then_some(value))
            .ok_or_else(|| BtfError::Mismatch("enum cgroup_subsys_id has no memory_cgrp_id".into()))?;
        let pointer = size_of::<u64>() as u32;
        Ok(BatchPath {
            memcg_css_off: self.member_offset("mem_cgroup", "css")?,
            memcg_memory_off: self.member_offset("mem_cgroup", "memory")?,
            counter_usage_off: self.member_offset("page_counter", "usage")?,
            counter_parent_off: self.member_offset("page_counter", "parent")?,
            cgroup_memory_css_off: self.member_offset("cgroup", "subsys")? + memory_id * pointer,
        })
    }

    /// Checks that raw tracepoint `name` is `(void *, struct <arg0> *, int, int)`, the
    /// arguments the program reads.
    pub fn check_memcg_tracepoint(&self, name: &str) -> Result<(), BtfError> {
        let typedef = format!("btf_trace_{name}");
        let mismatch = |what: &str| BtfError::Mismatch(format!("raw tracepoint {name}: {what}"));
        let t = self
            .btf
            .resolve_types_by_name(&typedef)
            .map_err(|_| mismatch("does not exist on this kernel"))?
            .into_iter()
            .next()
            .ok_or_else(|| mismatch("does not exist on this kernel"))?;
        let Type::Typedef(td) = t else { return Err(mismatch("is not a typedef")) };
        let Type::Ptr(ptr) = self.btf.resolve_chained_type(&td).map_err(|e| self.err(e))? else {
            return Err(mismatch("is not a function pointer"));
        };
        let Type::FuncProto(proto) = self.btf.resolve_chained_type(&ptr).map_err(|e| self.err(e))? else {
            return Err(mismatch("is not a function pointer"));
        };
        if proto.parameters.len() != 4 {
            return Err(mismatch(&format!(
                "has {} arguments, evictd was built for 4",
                proto.parameters.len()
            )));
        }
        let arg = |i: usize| self.btf.resolve_chained_type(&proto.parameters[i]).map_err(|e| self.err(e));
        let memcg_ok = match arg(1)? {
            Type::Ptr(p) => {
                let pointee = self.btf.resolve_chained_type(&p).map_err(|e| self.err(e))?;
                self.name_of(&pointee).as_deref() == Some("mem_cgroup")
            }
            _ => false,
        };
        if !memcg_ok {
            return Err(mismatch("argument 1 is not struct mem_cgroup *"));
        }
        if self.name_of(&arg(2)?).as_deref() != Some("int") {
            return Err(mismatch("argument 2 is not int"));
        }
        // `val` is int up to 6.x and long on 7.x (seen in Debian's 7.3 in the VM matrix). The
        // kernel hands a raw tracepoint each argument zero-extended to 64 bits from its own
        // size; the program reads the low 32 bits as i32, the same number for either type
        // (one call never moves 2^31 pages).
        match arg(3)? {
            Type::Int(i) if i.is_signed() && matches!(i.size(), 4 | 8) => Ok(()),
            _ => Err(mismatch("argument 3 is not a signed int or long")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_has_the_memcg_tracepoints_and_the_id_path() {
        let path = Path::new(crate::kernel::stat_items::VMLINUX_BTF);
        if !path.exists() {
            crate::skip(
                "this_kernel_has_the_memcg_tracepoints_and_the_id_path",
                &format!("no {}", path.display()),
            );
            return;
        }
        let btf = KernelBtf::open(path).expect("BTF");
        btf.check_memcg_tracepoint("mod_memcg_lruvec_state").expect("lruvec prototype");
        btf.check_memcg_tracepoint("mod_memcg_state").expect("memcg prototype");
        let p = btf.memcg_id_path().expect("id path");
        assert!(p.cgroup_kn_off > 0 && p.kn_id_off > 0, "{p:?}");
        assert!(btf.check_memcg_tracepoint("no_such_tracepoint").is_err());
        // Shape mismatches are refused, not misread.
        let e = btf.check_memcg_tracepoint("mm_vmscan_direct_reclaim_begin").unwrap_err();
        assert!(e.to_string().contains("mm_vmscan_direct_reclaim_begin"), "{e}");
        assert!(btf.member_offset("cgroup", "no_such_member").is_err());
    }
}
