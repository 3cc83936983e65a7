//! A *dry* view of a checkpoint's tensors, for checking what a build of them would do without
//! the memory: small tensors read as they are on disk (norms, biases, shape tensors: their values
//! may be checked), large ones as zeros from one untouched zeroed allocation, and every tensor
//! asked for recorded. A model checks a layer it will stream this way at load time.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, OnceLock};

use crate::{Checkpoint, Preloaded};

/// Tensors at most this large are read for real in a dry build (norms, biases, shape tensors:
/// their values may be checked); larger ones read as zeros.
const DRY_REAL_BYTES: u64 = 64 << 10;

/// A small tensor's bytes, read on first use (`None`: the read failed).
type SmallBytes = OnceLock<Option<Vec<u8>>>;

/// A dry view's bytes: small tensors as they are on disk (read when first asked), large ones as
/// zeros from one untouched zeroed allocation (no memory until read), and a record of every
/// tensor asked for.
pub struct DryView {
    /// name -> (length, its bytes once read: small tensors only)
    tensors: HashMap<String, (u64, SmallBytes)>,
    ckpt: Checkpoint,
    zeros: Vec<u8>,
    asked: Mutex<BTreeSet<String>>,
}

impl DryView {
    /// A dry view of `names` (tensors of `ckpt`).
    pub fn new(ckpt: &Checkpoint, names: Vec<String>) -> DryView {
        let mut largest = 0;
        let tensors = names
            .into_iter()
            .filter_map(|n| {
                let len = ckpt.entry(&n).ok()?.info.len;
                if len > DRY_REAL_BYTES {
                    largest = largest.max(len as usize);
                }
                Some((n, (len, OnceLock::new())))
            })
            .collect();
        DryView {
            tensors,
            ckpt: ckpt.clone(),
            // calloc: pages of a large zeroed allocation are only mapped when touched.
            zeros: vec![0u8; largest],
            asked: Mutex::new(BTreeSet::new()),
        }
    }

    /// Every tensor a build asked for, sorted.
    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().expect("dry lock").iter().cloned().collect()
    }
}

// SAFETY: the bytes live in `self` (never changed after they are first set), which the owner
// passed with them keeps alive.
unsafe impl Preloaded for DryView {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        let (len, real) = self.tensors.get(name)?;
        self.asked.lock().expect("dry lock").insert(name.to_string());
        if *len > DRY_REAL_BYTES {
            return Some(&self.zeros[..*len as usize]);
        }
        // A failed read serves nothing: the caller then reads the file and reports the error.
        real.get_or_init(|| self.ckpt.read_bytes(name).ok()).as_deref()
    }
}
