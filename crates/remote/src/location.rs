//! Where a model is: a local folder, `hf://ORG/NAME[@REVISION]` (Hugging Face resolve URLs
//! under `HF_ENDPOINT`), or an `http(s)://` folder URL on any server that honours `Range`. A
//! GGUF model in a repository is picked by its quantization (`hf://ORG/NAME:Q4_K_M`) or its
//! path (`hf://ORG/NAME/DIR/FILE.gguf`); a URL ending in `.gguf` is that one file.
//! A Hugging Face branch or tag is resolved once to a commit (`X-Repo-Commit`) and everything is
//! cached under that commit, so a moving branch never mixes two revisions.

use std::path::{Path, PathBuf};

use crate::http::Http;

pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    Hf {
        repo: String,
        revision: String,
        /// A GGUF file of the repository rather than its safetensors folder.
        pick: Option<Pick>,
    },
    /// A folder URL ending in `/`, or a `.gguf` file's URL.
    Url(String),
}

/// Which GGUF file of a repository: the one whose name carries a quantization tag
/// (`Q4_K_M`, `UD-Q2_K_XL`, `Q8_0`; the first part of a split model), or a path in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    Tag(String),
    Path(String),
}

#[derive(Clone, Debug, Default)]
pub struct RemoteOptions {
    /// Root of strata's cache (`--cache-dir`).
    pub cache_dir: PathBuf,
    /// Make no network request (`--offline`, `HF_HUB_OFFLINE=1`).
    pub offline: bool,
}

impl RemoteOptions {
    /// `--cache-dir` when given, else `$XDG_CACHE_HOME/strata` or `~/.cache/strata`; offline when
    /// asked or `HF_HUB_OFFLINE` is set to a true value.
    pub fn new(cache_dir: Option<PathBuf>, offline: bool) -> RemoteOptions {
        let cache_dir = cache_dir.unwrap_or_else(default_cache_dir);
        let env_offline = std::env::var("HF_HUB_OFFLINE")
            .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
            .unwrap_or(false);
        RemoteOptions {
            cache_dir,
            offline: offline || env_offline,
        }
    }
}

pub fn default_cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("strata");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("strata")
}

pub(crate) fn hf_endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_HF_ENDPOINT.to_string())
        .trim_end_matches('/')
        .to_string()
}

/// A name safe as one path component.
fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_matches('.')
        .to_string()
}

fn is_commit(rev: &str) -> bool {
    rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit())
}

/// The file list of a repository at a revision, saved beside its files (`--offline` picks
/// from it too).
pub const LISTING_FILE: &str = ".strata-files.json";

/// `{endpoint}/api/models/{repo}/revision/{revision}`: (the commit, the response's text, which
/// lists the repository's files as `siblings[].rfilename`).
pub fn hf_listing(
    http: &Http,
    endpoint: &str,
    repo: &str,
    revision: &str,
) -> Result<(String, String), String> {
    let url = format!("{endpoint}/api/models/{repo}/revision/{revision}");
    let f = http.get(&url).map_err(|e| e.to_string())?;
    let text = String::from_utf8(f.body).map_err(|_| format!("{url}: the answer is not UTF-8"))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{url}: the answer is not JSON: {e}"))?;
    let commit = v
        .get("sha")
        .and_then(|s| s.as_str())
        .filter(|c| is_commit(c))
        .ok_or_else(|| format!("{url}: no commit (`sha`) in the answer: cannot pin `{revision}`"))?;
    if !v.get("siblings").is_some_and(|s| s.is_array()) {
        return Err(format!("{url}: no file list (`siblings`) in the answer"));
    }
    Ok((commit.to_string(), text))
}

impl Location {
    pub fn parse(spec: &str) -> Location {
        if let Some(rest) = spec.strip_prefix("hf://") {
            // ORG/NAME[/PATH.gguf][@REVISION][:TAG], the tag also before the revision.
            let (rest, mut tag) = match rest.split_once(':') {
                Some((r, t)) => (r.to_string(), Some(t.to_string())),
                None => (rest.to_string(), None),
            };
            let (path, mut revision) = match rest.split_once('@') {
                Some((r, v)) if !v.is_empty() => (r.to_string(), v.to_string()),
                Some((r, _)) => (r.to_string(), "main".to_string()),
                None => (rest, "main".to_string()),
            };
            if let Some((t, v)) = tag.clone().as_deref().and_then(|t| t.split_once('@')) {
                (tag, revision) = (Some(t.to_string()), v.to_string());
            }
            let path = path.trim_matches('/');
            let mut parts = path.splitn(3, '/');
            let repo = match (parts.next(), parts.next()) {
                (Some(org), Some(name)) => format!("{org}/{name}"),
                _ => path.to_string(),
            };
            let pick = match (parts.next(), tag) {
                (Some(file), _) => Some(Pick::Path(file.to_string())),
                (None, Some(t)) if !t.is_empty() => Some(Pick::Tag(t)),
                _ => None,
            };
            Location::Hf { repo, revision, pick }
        } else if (spec.starts_with("http://") || spec.starts_with("https://"))
            && spec.to_ascii_lowercase().ends_with(".gguf")
        {
            Location::Url(spec.to_string())
        } else if spec.starts_with("http://") || spec.starts_with("https://") {
            Location::Url(format!("{}/", spec.trim_end_matches('/')))
        } else {
            Location::Local(PathBuf::from(spec))
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Location::Local(p) => p.display().to_string(),
            Location::Hf {
                repo,
                revision,
                pick: None,
            } => format!("hf://{repo}@{revision}"),
            Location::Hf {
                repo,
                revision,
                pick: Some(Pick::Tag(t)),
            } => format!("hf://{repo}@{revision}:{t}"),
            Location::Hf {
                repo,
                revision,
                pick: Some(Pick::Path(p)),
            } => format!("hf://{repo}/{p}@{revision}"),
            Location::Url(u) => u.clone(),
        }
    }

    /// The token to send and the only host it may go to.
    pub fn credentials(&self) -> (Option<String>, Option<String>) {
        match self {
            Location::Hf { .. } => {
                let host = reqwest::Url::parse(&hf_endpoint())
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_string));
                (crate::hub::token(), host)
            }
            _ => (None, None),
        }
    }

    /// The folder of this model's cached revisions.
    pub fn model_root(&self, options: &RemoteOptions) -> PathBuf {
        let name = match self {
            Location::Hf { repo, .. } => format!("hf--{}", slug(&repo.replace('/', "--"))),
            Location::Url(u) => {
                // The scheme is part of the name: http:// and https:// of one host are two sources.
                let (scheme, rest) = u.split_once("://").unwrap_or(("http", u.as_str()));
                format!("url--{scheme}--{}", slug(rest.trim_end_matches('/')))
            }
            Location::Local(_) => unreachable!("local folders have no cache"),
        };
        options.cache_dir.join("models").join(name)
    }

    /// The mirror folder and the base URL of the model's files at the resolved revision.
    pub fn resolve(&self, options: &RemoteOptions, http: Option<&Http>) -> Result<(PathBuf, String), String> {
        let root = self.model_root(options);
        match self {
            Location::Local(_) => unreachable!("local folders are not mirrored"),
            Location::Url(u) if u.ends_with('/') => Ok((root.join("files"), u.clone())),
            Location::Url(u) => {
                let folder = &u[..u.rfind('/').map_or(0, |i| i + 1)];
                Ok((root.join("files"), folder.to_string()))
            }
            Location::Hf { repo, revision, pick } => {
                let endpoint = hf_endpoint();
                let refs = root.join("refs").join(slug(revision));
                let commit = if is_commit(revision) {
                    revision.clone()
                } else if let Some(http) = http {
                    let commit = if pick.is_some() {
                        // A GGUF repository need not have a config.json: the hub's API says
                        // the commit, and lists the files to pick from.
                        let (commit, listing) = hf_listing(http, &endpoint, repo, revision)?;
                        let dir = root.join("snapshots").join(&commit);
                        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                        crate::mirror::write_atomic(&dir.join(LISTING_FILE), listing.as_bytes())?;
                        commit
                    } else {
                        let url = format!("{endpoint}/{repo}/resolve/{revision}/config.json");
                        let f = http.get(&url).map_err(|e| e.to_string())?;
                        f.headers
                            .get("x-repo-commit")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string)
                            .filter(|c| is_commit(c))
                            .ok_or_else(|| {
                                format!("{url}: no X-Repo-Commit header: cannot pin `{revision}` to a commit")
                            })?
                    };
                    std::fs::create_dir_all(refs.parent().expect("refs dir")).map_err(|e| e.to_string())?;
                    crate::mirror::write_atomic(&refs, commit.as_bytes())?;
                    commit
                } else {
                    // Offline: as strata resolved it last, else as the hub cache's refs say.
                    std::fs::read_to_string(&refs)
                        .map(|c| c.trim().to_string())
                        .ok()
                        .or_else(|| crate::hub::HubRepo::of(repo).read_ref(revision))
                        .ok_or_else(|| {
                            format!(
                                "offline, and hf://{repo}@{revision} was never resolved here (no {}, nor refs/{revision} in the Hugging Face cache {})",
                                refs.display(),
                                crate::hub::hub_dir().display()
                            )
                        })?
                };
                Ok((
                    root.join("snapshots").join(&commit),
                    format!("{endpoint}/{repo}/resolve/{commit}/"),
                ))
            }
        }
    }

    /// A complete copy of `name` in the Hugging Face cache (`HF_HUB_CACHE` layout) for the same
    /// commit, reused read-only.
    pub fn hf_cached_file(&self, _options: &RemoteOptions, mirror_dir: &Path, name: &str) -> Option<PathBuf> {
        let Location::Hf { repo, .. } = self else {
            return None;
        };
        let commit = mirror_dir.file_name()?.to_str()?;
        crate::hub::HubRepo::of(repo).file(commit, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse() {
        assert_eq!(
            Location::parse("hf://moonshotai/Kimi-K3@v1"),
            Location::Hf {
                repo: "moonshotai/Kimi-K3".into(),
                revision: "v1".into(),
                pick: None,
            }
        );
        assert_eq!(
            Location::parse("hf://org/name"),
            Location::Hf {
                repo: "org/name".into(),
                revision: "main".into(),
                pick: None,
            }
        );
        assert_eq!(
            Location::parse("https://cdn.example/m"),
            Location::Url("https://cdn.example/m/".into())
        );
        assert_eq!(
            Location::parse("./models/x"),
            Location::Local("./models/x".into())
        );
        assert_eq!(slug("a/b c"), "a-b-c");
    }

    #[test]
    fn http_and_https_of_one_host_are_cached_apart() {
        let options = RemoteOptions::new(Some("/c".into()), true);
        let a = Location::parse("http://host.example/m").model_root(&options);
        let b = Location::parse("https://host.example/m").model_root(&options);
        assert_ne!(a, b);
        assert!(a.to_string_lossy().contains("url--http--host.example-m"), "{a:?}");
    }
}
