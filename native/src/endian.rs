//! MySQL's fixed-width integers as they sit in events and row images: little-endian almost
//! everywhere, big-endian in the packed temporal and DECIMAL layouts.

#[inline]
pub(crate) fn le(b: &[u8]) -> u64 {
    b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64)
}

#[inline]
pub(crate) fn be(b: &[u8]) -> u64 {
    b.iter().fold(0u64, |acc, &x| (acc << 8) | x as u64)
}
