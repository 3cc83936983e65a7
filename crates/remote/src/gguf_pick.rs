//! A remote GGUF model: the file a location picks (a quantization tag among a repository's
//! files, a path in it, or a `.gguf` URL), its split parts, and its header fetched before the
//! model opens (a GGUF header has no length up front: a first MiB, then four times as much
//! until the header is whole). Tensor bytes then come as a safetensors shard's do, one `Range`
//! request per missing run.

use std::path::Path;

use serde_json::Value;
use strata_formats::gguf::{split_part, split_part_names};
use strata_formats::RangeSource;

use crate::location::{hf_listing, Location, Pick, RemoteOptions, LISTING_FILE};
use crate::mirror::{write_atomic, Mirror};

/// Whether the location names a GGUF file rather than a safetensors folder.
pub(crate) fn is_gguf(location: &Location) -> bool {
    match location {
        Location::Hf { pick, .. } => pick.is_some(),
        Location::Url(u) => !u.ends_with('/'),
        Location::Local(_) => false,
    }
}

/// The bytes fetched first for a GGUF header, and the most a header may take.
const FIRST_HEADER_BYTES: u64 = 1 << 20;
const MAX_GGUF_HEADER_BYTES: u64 = 1 << 30;

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether `path` is a later part of a split model (`-0000K-of-0000N.gguf`, K > 1).
fn later_part(path: &str) -> bool {
    split_part(path).is_some_and(|(_, no, _)| no > 1)
}

/// Every file of the model whose first file is `path`.
fn parts(path: &str) -> Vec<String> {
    match split_part(path) {
        Some((prefix, 1, n)) => split_part_names(prefix, n),
        _ => vec![path.to_string()],
    }
}

/// Whether `tag` appears in `path` as a whole part of it: case aside, bounded by the start or
/// one of `-._/` before and by the end or one of `-./` after (so `Q4_K` is not `Q4_K_M`).
fn carries_tag(path: &str, tag: &str) -> bool {
    let (p, t) = (path.to_ascii_lowercase(), tag.to_ascii_lowercase());
    if t.is_empty() {
        return false;
    }
    p.match_indices(&t).any(|(i, _)| {
        let before = p[..i].chars().next_back();
        let after = p[i + t.len()..].chars().next();
        before.is_none_or(|c| "-._/".contains(c)) && after.is_none_or(|c| "-./".contains(c))
    })
}

/// The quantization tags of the GGUF models among `files`, for an error's list.
fn tags_of(models: &[&String]) -> Vec<String> {
    const KNOWN: &[&str] = &[
        "f32", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q5_k_s", "q5_k", "q5_1", "q5_0", "q4_k_m", "q4_k_s",
        "q4_k", "q4_1", "q4_0", "q3_k_l", "q3_k_m", "q3_k_s", "q2_k", "iq4_nl", "iq4_xs", "mxfp4",
    ];
    let mut tags: Vec<String> = models
        .iter()
        .flat_map(|m| {
            KNOWN
                .iter()
                .filter(|k| carries_tag(m, k))
                .map(|k| k.to_ascii_uppercase())
        })
        .collect();
    tags.sort();
    tags.dedup();
    tags
}

/// The files (paths in the repository, first file first) of the GGUF model `pick` names among
/// the repository's `files`.
pub(crate) fn select(pick: &Pick, files: &[String], what: &str) -> Result<Vec<String>, String> {
    let is_model = |f: &&String| {
        f.to_ascii_lowercase().ends_with(".gguf") && !base_name(f).contains("mmproj") && !later_part(f)
    };
    let models: Vec<&String> = files.iter().filter(is_model).collect();
    let listed = || {
        if models.is_empty() {
            "it has no GGUF files".to_string()
        } else {
            let names: Vec<&str> = models.iter().map(|m| m.as_str()).collect();
            format!("its GGUF models: {}", names.join(", "))
        }
    };
    let chosen = match pick {
        Pick::Path(p) => {
            if !files.iter().any(|f| f == p) {
                return Err(format!("{what} has no file {p} ({})", listed()));
            }
            if !p.to_ascii_lowercase().ends_with(".gguf") {
                return Err(format!("{what}: {p} is not a .gguf file"));
            }
            p.clone()
        }
        Pick::Tag(t) => {
            let hits: Vec<&&String> = models.iter().filter(|m| carries_tag(m, t)).collect();
            match hits.as_slice() {
                [one] => one.to_string(),
                [] => {
                    let tags = tags_of(&models);
                    return Err(if tags.is_empty() {
                        format!("{what} has no GGUF file tagged {t} ({})", listed())
                    } else {
                        format!("{what} has no GGUF file tagged {t}; it has {}", tags.join(", "))
                    });
                }
                many => {
                    let names: Vec<&str> = many.iter().map(|m| m.as_str()).collect();
                    return Err(format!(
                        "{what}: several GGUF models are tagged {t} ({}): name one by its path (hf://ORG/NAME/PATH)",
                        names.join(", ")
                    ));
                }
            }
        }
    };
    let all = parts(&chosen);
    if let Some(missing) = all.iter().find(|p| !files.contains(p)) {
        return Err(format!(
            "{what}: {chosen} is split, but its part {missing} is not in the repository"
        ));
    }
    Ok(all)
}

impl Mirror {
    /// Opens the GGUF model `location` names: its files picked, each a shard of the mirror
    /// under its file name, every header fetched.
    pub(crate) fn open_gguf(&mut self, location: &Location, options: &RemoteOptions) -> Result<(), String> {
        let wanted: Vec<String> = match location {
            Location::Hf {
                pick: Some(pick),
                repo,
                ..
            } => {
                let files = self.repo_files(location, repo)?;
                select(pick, &files, &location.describe())?
            }
            Location::Url(u) => parts(base_name(u)),
            _ => unreachable!("not a GGUF location"),
        };
        let mut names: Vec<String> = Vec::with_capacity(wanted.len());
        for remote in &wanted {
            let name = base_name(remote).to_string();
            if name.starts_with('.') || name.contains("..") || names.contains(&name) {
                return Err(format!(
                    "{}: `{remote}` cannot be cached by its file name",
                    location.describe()
                ));
            }
            self.add_shard(location, options, &name, remote)?;
            self.fetch_gguf_header(&name)?;
            names.push(name);
        }
        self.gguf = names.first().cloned();
        self.shard_names = names;
        Ok(())
    }

    /// The repository's files at the mirror's commit: as saved when it was resolved, else asked
    /// of the hub (a revision given as a commit) and saved.
    fn repo_files(&self, location: &Location, repo: &str) -> Result<Vec<String>, String> {
        let path = self.dir.join(LISTING_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(_) => {
                let http = self.http.as_ref().ok_or_else(|| {
                    format!(
                        "offline, and the files of {} were never listed here ({} is missing)",
                        location.describe(),
                        path.display()
                    )
                })?;
                let commit = self.dir.file_name().and_then(|c| c.to_str()).unwrap_or("main");
                let (_, text) = hf_listing(http, &crate::location::hf_endpoint(), repo, commit)?;
                write_atomic(&path, text.as_bytes())?;
                text
            }
        };
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(v["siblings"]
            .as_array()
            .map(|s| {
                s.iter()
                    .filter_map(|f| f["rfilename"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Makes the GGUF header of shard `name` present: a first MiB, then four times as much
    /// until it parses whole. A file that is not a GGUF is an error naming its URL, and its
    /// bytes are forgotten so the next open asks again.
    fn fetch_gguf_header(&self, name: &str) -> Result<(), String> {
        let size = self.size_of(name)?;
        let url = self.url(name);
        // STRATA_GGUF_FIRST_BYTES: a smaller first request (tests: a header in several steps).
        let first = std::env::var("STRATA_GGUF_FIRST_BYTES")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&n| n >= 8)
            .unwrap_or(FIRST_HEADER_BYTES);
        let mut want = first.min(size);
        loop {
            self.ensure(name, 0, want)?;
            let mut prefix = vec![0u8; want as usize];
            self.read_at(name, &mut prefix, 0)?;
            match strata_formats::gguf::header_end(&prefix, size, Path::new(&url)) {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if want < size.min(MAX_GGUF_HEADER_BYTES) => {
                    want = (want * 4).min(size).min(MAX_GGUF_HEADER_BYTES)
                }
                Ok(None) => {
                    return Err(format!(
                        "{url}: the GGUF header goes on past {want} bytes (at most {MAX_GGUF_HEADER_BYTES} are read)"
                    ))
                }
                Err(e) => {
                    self.forget(name)?;
                    return Err(e.to_string());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_tag_picks_its_model_and_every_part() {
        let repo = files(&[
            "README.md",
            "Model-Q4_K_M.gguf",
            "Model-Q4_K_S.gguf",
            "Model-Q8_0.gguf",
            "mmproj-Model-Q8_0.gguf",
            "BF16/Model-BF16-00001-of-00003.gguf",
            "BF16/Model-BF16-00002-of-00003.gguf",
            "BF16/Model-BF16-00003-of-00003.gguf",
            "UD-Q2_K_XL/Model-UD-Q2_K_XL-00001-of-00002.gguf",
            "UD-Q2_K_XL/Model-UD-Q2_K_XL-00002-of-00002.gguf",
        ]);
        let tag = |t: &str| select(&Pick::Tag(t.into()), &repo, "hf://o/m");
        assert_eq!(tag("Q4_K_M").unwrap(), ["Model-Q4_K_M.gguf"]);
        assert_eq!(
            tag("q8_0").unwrap(),
            ["Model-Q8_0.gguf"],
            "case aside; not the projector"
        );
        assert_eq!(
            tag("BF16").unwrap(),
            [
                "BF16/Model-BF16-00001-of-00003.gguf",
                "BF16/Model-BF16-00002-of-00003.gguf",
                "BF16/Model-BF16-00003-of-00003.gguf"
            ]
        );
        assert_eq!(tag("UD-Q2_K_XL").unwrap().len(), 2);
        let e = tag("Q4_K").unwrap_err();
        assert!(
            e.contains("no GGUF file tagged Q4_K") && e.contains("Q4_K_M"),
            "{e}"
        );
        let e = tag("Q6_K").unwrap_err();
        assert!(e.contains("BF16, Q4_K_M, Q4_K_S, Q8_0"), "{e}");
        assert!(tag("Q2_K").unwrap_err().contains("no GGUF file tagged"));
        let path = |p: &str| select(&Pick::Path(p.into()), &repo, "hf://o/m");
        assert_eq!(path("BF16/Model-BF16-00001-of-00003.gguf").unwrap().len(), 3);
        assert!(path("Model-Q5_K_M.gguf").unwrap_err().contains("has no file"));
        assert!(path("README.md").unwrap_err().contains("not a .gguf"));
    }

    #[test]
    fn ambiguous_tags_and_missing_parts_are_errors() {
        let repo = files(&["a/M-Q8_0.gguf", "b/M-Q8_0.gguf", "M-F16-00001-of-00002.gguf"]);
        let e = select(&Pick::Tag("Q8_0".into()), &repo, "r").unwrap_err();
        assert!(e.contains("several") && e.contains("a/M-Q8_0.gguf"), "{e}");
        let e = select(&Pick::Tag("F16".into()), &repo, "r").unwrap_err();
        assert!(e.contains("part M-F16-00002-of-00002.gguf"), "{e}");
        assert!(select(&Pick::Tag("Q8_0".into()), &files(&[]), "r")
            .unwrap_err()
            .contains("no GGUF files"));
    }

    #[test]
    fn locations_with_a_pick_parse() {
        let hf = |s: &str| Location::parse(s);
        let want = |repo: &str, rev: &str, pick: Option<Pick>| Location::Hf {
            repo: repo.into(),
            revision: rev.into(),
            pick,
        };
        let tag = |t: &str| Some(Pick::Tag(t.into()));
        assert_eq!(hf("hf://o/m:Q4_K_M"), want("o/m", "main", tag("Q4_K_M")));
        assert_eq!(hf("hf://o/m@v2:Q4_K_M"), want("o/m", "v2", tag("Q4_K_M")));
        assert_eq!(hf("hf://o/m:Q4_K_M@v2"), want("o/m", "v2", tag("Q4_K_M")));
        assert_eq!(
            hf("hf://o/m/BF16/x-00001-of-00002.gguf@v2"),
            want("o/m", "v2", Some(Pick::Path("BF16/x-00001-of-00002.gguf".into())))
        );
        assert_eq!(hf("hf://o/m"), want("o/m", "main", None));
        assert!(is_gguf(&hf("https://h/x/m.gguf")));
        assert!(!is_gguf(&hf("https://h/x/m")));
    }
}
