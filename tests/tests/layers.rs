//! The one-way house, checked: every `crate::` path in evictd's own code (tests left out: a
//! test may reach anywhere) names a module at or below its own in `evictd::LAYERS`. It reads
//! the sources, so it runs on the host and not in the VM matrix.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use evictd::LAYERS;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its test module (which the files keep at their end) and
/// without comments.
fn product_code(src: &str) -> String {
    let end = src.find("#[cfg(test)]").unwrap_or(src.len());
    src[..end].lines().map(|l| l.split_once("//").map_or(l, |(code, _)| code)).collect::<Vec<_>>().join("\n")
}

/// The top-level modules named by `crate::` paths, also inside `crate::{…}` groups, and by
/// `super::` paths that climb to the crate's root from a module `depth` levels down.
fn crate_modules(code: &str, depth: usize) -> BTreeSet<String> {
    let to_root = "super::".repeat(depth);
    let mut found = BTreeSet::new();
    let starts = code
        .match_indices("crate::")
        .map(|(at, m)| at + m.len())
        .chain(code.match_indices(to_root.as_str()).map(|(at, m)| at + m.len()).filter(|_| depth > 0));
    for start in starts {
        let rest = &code[start..];
        // `super::super::x` seen from one level down is not the root: skip partial climbs.
        if rest.starts_with("super::") {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        let name: String =
                            group[i..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        found.insert(name);
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    found
}

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == module)
}

/// Every top-level module has its place in the layers: a new one cannot slip past the check.
#[test]
fn every_module_is_in_a_layer() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../evictd/src/lib.rs")).unwrap();
    for line in lib.lines().filter_map(|l| l.strip_prefix("pub mod ")) {
        let module = line.trim_end_matches(';');
        assert!(layer(module).is_some(), "evictd::{module} is in no layer of evictd::LAYERS");
    }
}

#[test]
fn imports_run_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../evictd/src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap();
        let Some(own) = rel.iter().next().and_then(|c| c.to_str()).map(|c| c.trim_end_matches(".rs")) else {
            continue;
        };
        let Some(own_layer) = layer(own) else { continue };
        if rel.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        // `wake/mod.rs` and `wake.rs` are the module `wake`, one level down; `wake/ebpf.rs` two.
        let depth = rel.components().count() - usize::from(rel.file_name().is_some_and(|f| f == "mod.rs"));
        for module in crate_modules(&product_code(&std::fs::read_to_string(file).unwrap()), depth) {
            let Some(their_layer) = layer(&module) else { continue };
            checked += 1;
            if their_layer < own_layer {
                wrong.push(format!("{} imports crate::{module}, a layer above {own}", rel.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "imports running back up the layers:\n{}", wrong.join("\n"));
    assert!(checked > 50, "only {checked} imports found: the scan is broken");
}

#[test]
fn the_scan_sees_grouped_and_inline_paths() {
    let code = "use crate::{\n    runtime::cri::{A, B},\n    vocab::X,\n};\nfn f() { crate::wake::g(); }";
    let found: Vec<String> = crate_modules(code, 1).into_iter().collect();
    assert_eq!(found, ["runtime", "vocab", "wake"]);
    // From `daemon/pressure.rs` (two levels down), `super::super::report` is the crate's
    // `report`; `super::x` is a sibling inside `daemon`.
    let climbs: Vec<String> =
        crate_modules("use super::super::report::X; use super::y;", 2).into_iter().collect();
    assert_eq!(climbs, ["report"]);
    assert_eq!(product_code("a // crate::cli\n#[cfg(test)]\nmod tests { crate::cli }"), "a ");
}
