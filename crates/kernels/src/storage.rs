//! Where a weight's elements live: a vector of its own, or a view into a buffer someone else
//! filled (an expert's read buffer), kept alive by a shared owner. The view is what lets the
//! expert store compute straight on the bytes it read from disk, with no copy into fresh memory
//! (fresh memory costs a page fault and a page of zeroing per 4 KiB: a third of all CPU time when
//! every token decodes hundreds of MB of experts).

use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// Element types a weight is stored as: any bit pattern is a valid value.
pub trait Pod: Copy + Send + Sync + 'static {}
impl Pod for u8 {}
impl Pod for i8 {}
impl Pod for u16 {}
impl Pod for u32 {}
impl Pod for f32 {}

/// Whatever keeps borrowed bytes alive.
pub type Owner = Arc<dyn Any + Send + Sync>;

pub struct Storage<T: Pod> {
    repr: Repr<T>,
}

enum Repr<T: Pod> {
    Owned(Vec<T>),
    Borrowed {
        _owner: Owner,
        ptr: *const T,
        len: usize,
    },
}

// SAFETY: Borrowed points into memory the owner keeps alive and nobody writes (see `borrow`);
// T is plain data.
unsafe impl<T: Pod> Send for Storage<T> {}
// SAFETY: as above; only shared reads happen through &Storage.
unsafe impl<T: Pod> Sync for Storage<T> {}

impl<T: Pod> Storage<T> {
    /// A view of `bytes` as T elements, or None when they are not aligned for T, not a whole
    /// number of elements, or the target is big-endian (the bytes are little-endian).
    ///
    /// # Safety
    /// `bytes` must stay valid and unchanged for as long as `owner` lives.
    pub unsafe fn borrow(owner: &Owner, bytes: &[u8]) -> Option<Storage<T>> {
        let size = std::mem::size_of::<T>();
        if cfg!(target_endian = "big")
            || !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
            || !bytes.len().is_multiple_of(size)
        {
            return None;
        }
        Some(Storage {
            repr: Repr::Borrowed {
                _owner: owner.clone(),
                ptr: bytes.as_ptr() as *const T,
                len: bytes.len() / size,
            },
        })
    }

    /// Whether the elements are a view into someone else's buffer.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.repr, Repr::Borrowed { .. })
    }
}

impl<T: Pod> Deref for Storage<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.repr {
            Repr::Owned(v) => v,
            // SAFETY: ptr/len describe aligned, initialised memory that the owner keeps alive
            // and unchanged (the contract of `borrow`).
            Repr::Borrowed { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

impl<T: Pod> From<Vec<T>> for Storage<T> {
    fn from(v: Vec<T>) -> Storage<T> {
        Storage { repr: Repr::Owned(v) }
    }
}

impl<T: Pod> FromIterator<T> for Storage<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Storage<T> {
        iter.into_iter().collect::<Vec<T>>().into()
    }
}

impl<T: Pod> Clone for Storage<T> {
    fn clone(&self) -> Storage<T> {
        match &self.repr {
            Repr::Owned(v) => v.clone().into(),
            Repr::Borrowed { _owner, ptr, len } => Storage {
                repr: Repr::Borrowed {
                    _owner: _owner.clone(),
                    ptr: *ptr,
                    len: *len,
                },
            },
        }
    }
}

impl<T: Pod> fmt::Debug for Storage<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Storage({} elements, {})",
            self.len(),
            if self.is_borrowed() { "borrowed" } else { "owned" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_reads_the_owner_bytes_and_keeps_them_alive() {
        let buf: Vec<u32> = vec![1, 2, 3, 0x0403_0201];
        let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_le_bytes()).collect();
        let owner: Owner = Arc::new(buf);
        let words = {
            let b = owner.downcast_ref::<Vec<u32>>().unwrap();
            // SAFETY: the bytes of a Vec<u32> the owner holds and nobody changes.
            let view = unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, b.len() * 4) };
            unsafe { Storage::<u32>::borrow(&owner, view) }.expect("aligned")
        };
        drop(owner);
        assert!(words.is_borrowed());
        assert_eq!(&words[..], &[1, 2, 3, 0x0403_0201]);
        let _ = bytes;
    }

    #[test]
    fn misaligned_or_partial_bytes_are_refused() {
        let owner: Owner = Arc::new(vec![0u32; 4]);
        let b = owner.downcast_ref::<Vec<u32>>().unwrap();
        // SAFETY: as above.
        let view = unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, 16) };
        assert!(unsafe { Storage::<u32>::borrow(&owner, &view[1..5]) }.is_none());
        assert!(unsafe { Storage::<u32>::borrow(&owner, &view[..6]) }.is_none());
        assert!(unsafe { Storage::<u16>::borrow(&owner, &view[2..6]) }.is_some());
    }
}
