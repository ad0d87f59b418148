//! Protocol-buffer wire reading (`Rd`) shared by the Prewrite decode (prewrite.rs) and the transaction
//! join (txnjoin.rs): bounds-checked, every error names the byte it happened at, and groups are
//! nested at most 100 deep so hostile bytes cannot exhaust the stack.

pub(crate) struct Rd<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) p: usize,
    end: usize,
}

pub(crate) type WireResult<T> = Result<T, String>;

impl<'a> Rd<'a> {
    pub(crate) fn new(b: &'a [u8], start: usize, end: usize) -> Self {
        Rd { b, p: start, end }
    }

    #[inline]
    pub(crate) fn more(&self) -> bool {
        self.p < self.end
    }

    #[inline]
    pub(crate) fn varint(&mut self) -> WireResult<u64> {
        let mut v: u64 = 0;
        let mut shift = 0u32;
        loop {
            if self.p >= self.end {
                return Err(format!("truncated varint at byte {}", self.p));
            }
            let x = self.b[self.p];
            self.p += 1;
            if shift < 64 {
                v |= ((x & 0x7F) as u64) << shift;
            }
            if x < 0x80 {
                return Ok(v);
            }
            shift += 7;
            if shift >= 70 {
                return Err(format!("varint longer than 10 bytes ending at byte {}", self.p));
            }
        }
    }

    #[inline]
    pub(crate) fn tag(&mut self) -> WireResult<(u64, u8)> {
        let at = self.p;
        let t = self.varint()?;
        let field = t >> 3;
        if field == 0 {
            return Err(format!("field number 0 at byte {at}"));
        }
        Ok((field, (t & 7) as u8))
    }

    #[inline]
    pub(crate) fn span(&mut self) -> WireResult<(usize, usize)> {
        let at = self.p;
        let n = self.varint()?;
        let start = self.p;
        match (n as usize).checked_add(start) {
            Some(e) if n <= usize::MAX as u64 && e <= self.end => {
                self.p = e;
                Ok((start, e))
            }
            _ => Err(format!("length {n} at byte {at} runs past the end of its message (byte {})", self.end)),
        }
    }

    /// A length-delimited field's bytes.
    #[inline]
    pub(crate) fn bytes(&mut self) -> WireResult<&'a [u8]> {
        let (s, e) = self.span()?;
        Ok(&self.b[s..e])
    }

    pub(crate) fn fixed(&mut self, n: usize) -> WireResult<&'a [u8]> {
        if self.p + n > self.end {
            return Err(format!("truncated fixed{} at byte {}", n * 8, self.p));
        }
        let s = &self.b[self.p..self.p + n];
        self.p += n;
        Ok(s)
    }

    pub(crate) fn skip(&mut self, wire: u8, field: u64) -> WireResult<()> {
        self.skip_nested(wire, field, 0)
    }

    /// Groups nest: bounded like upb's default depth, so hostile bytes cannot exhaust the stack.
    pub(crate) fn skip_nested(&mut self, wire: u8, field: u64, depth: u32) -> WireResult<()> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.fixed(8).map(|_| ()),
            2 => self.span().map(|_| ()),
            5 => self.fixed(4).map(|_| ()),
            3 => {
                // a group: skip to its matching end tag
                if depth >= 100 {
                    return Err(format!("groups nested deeper than 100 at byte {}", self.p));
                }
                loop {
                    if !self.more() {
                        return Err(format!("unterminated group {field} at byte {}", self.p));
                    }
                    let (f, w) = self.tag()?;
                    if w == 4 {
                        if f != field {
                            return Err(format!("group {field} closed by end tag {f} at byte {}", self.p));
                        }
                        return Ok(());
                    }
                    self.skip_nested(w, f, depth + 1)?;
                }
            }
            _ => Err(format!("wire type {wire} of field {field} at byte {}", self.p)),
        }
    }
}

// writing: the protobuf bytes the row decoder (rowdecoder.rs) builds
// ------------------------------------------------------------------------------------------------

#[inline]
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
pub(crate) fn put_tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(out, ((field << 3) | wire) as u64);
}

#[inline]
pub(crate) fn put_len_field(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    put_tag(out, field, 2);
    put_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// A proto3 varint field (unsigned, or an int64 as its two's complement bits): zero is the
/// default and is not written. DateTimeValue / TimeValue (rowdecoder.rs), pump writes (pumpwrite.rs).
#[inline]
pub(crate) fn put_u32_field(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_tag(out, field, 0);
        put_varint(out, v);
    }
}

/// int32 (year): negative values are sign-extended to 10 bytes, as protobuf does.
#[inline]
pub(crate) fn put_i32_field(out: &mut Vec<u8>, field: u32, v: i64) {
    if v != 0 {
        put_tag(out, field, 0);
        put_varint(out, (v as i32) as i64 as u64);
    }
}
