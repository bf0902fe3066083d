//! The text of a tracepoint `format` file.
//!
//! Self-contained (std alone, no `crate::` or `super::`): the fuzz targets compile this file
//! on its own, so fuzzing the parser does not build the daemon and its dependencies.

/// One `field:` line of a tracepoint format file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatField {
    pub decl: String,
    pub name: String,
    pub offset: usize,
    pub size: usize,
}

/// Parses the fields of a tracepoint `format` file.
pub fn parse_format(text: &str) -> Vec<FormatField> {
    text.lines()
        .filter_map(|line| {
            let mut decl = None;
            let mut offset = None;
            let mut size = None;
            for part in line.trim().split(';') {
                let part = part.trim();
                if let Some(d) = part.strip_prefix("field:") {
                    decl = Some(d.trim().to_owned());
                } else if let Some(o) = part.strip_prefix("offset:") {
                    offset = o.parse().ok();
                } else if let Some(s) = part.strip_prefix("size:") {
                    size = s.parse().ok();
                }
            }
            let decl = decl?;
            // The name is the last identifier of the declaration (`char comm[16]` -> comm).
            let name = decl.split_whitespace().last()?.split('[').next()?.to_owned();
            Some(FormatField { decl, name, offset: offset?, size: size? })
        })
        .collect()
}
