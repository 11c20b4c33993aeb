//! The library's modules form no import circles: every `crate::...`, `super::...` and
//! `self::...` path in `src/` (outside comments and test modules) is resolved to the module
//! file it names, and the graph of files naming files has no cycle. A file naming its own
//! parent or children counts like any other edge; `impl` blocks split over files do not
//! (they name the type's module once, from below). The layers of `src/lib.rs` stay layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The module path of a source file under `src/` (`src/cache/mod.rs` is `cache`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without comments and without what follows its first `#[cfg(test)]`.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `file` (module `me`) names.
fn references(me: &[String], text: &str, modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let path = regex::Regex::new(r"\b(crate|super|self)((?:::[a-z_][a-z0-9_]*)+)").unwrap();
    let mut out = BTreeSet::new();
    for m in path.captures_iter(&code(text)) {
        let mut segs: Vec<&str> = m[2].split("::").filter(|s| !s.is_empty()).collect();
        let mut base: Vec<String> = match &m[1] {
            "crate" => Vec::new(),
            "self" => me.to_vec(),
            _ => me[..me.len().saturating_sub(1)].to_vec(),
        };
        while segs.first() == Some(&"super") {
            segs.remove(0);
            base.pop();
        }
        // The longest prefix that is a module of its own file.
        let target = (1..=segs.len()).rev().find_map(|k| {
            let mut cand = base.clone();
            cand.extend(segs[..k].iter().map(|s| s.to_string()));
            modules.contains(&cand).then_some(cand)
        });
        if let Some(t) = target.filter(|t| t != me) {
            out.insert(t);
        }
    }
    out
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a Vec<String>) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        for w in t.edges.get(v).into_iter().flatten() {
            let Some((w, _)) = t.edges.get_key_value(w) else {
                continue;
            };
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.stack.contains(&w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                comp.push(w.join("::"));
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn the_library_has_no_import_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges = BTreeMap::new();
    for f in &files {
        let me = module_of(&src, f);
        if me.is_empty() || me == ["lib"] || me == ["internals"] {
            continue; // the crate root and the list of parts name everything
        }
        let text = std::fs::read_to_string(f).unwrap();
        edges.insert(me.clone(), references(&me, &text, &modules));
    }
    assert!(edges.len() > 100, "only {} modules found", edges.len());
    // The analysis sees edges at all: the engine names the runner, the runner the model.
    let named = |a: &str, b: &str| {
        let key: Vec<String> = a.split("::").map(String::from).collect();
        edges[&key].iter().any(|t| t.join("::") == b)
    };
    assert!(named("engine::core", "runner") && named("runner", "model::gpu"));
    let found = cycles(&edges);
    assert!(found.is_empty(), "import circles: {found:?}");
}
