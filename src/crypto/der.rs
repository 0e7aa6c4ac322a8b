//! A DER reader over definite, shortest lengths and one-byte tags: what X.509 and PKCS#7 use.
//! The certificate walks (activation's peer names) and the PKCS#7 signatures read through it.

/// A DER reader over definite lengths and one-byte tags: what PKCS#7 and X.509 use.
pub(crate) struct Der<'a>(pub(crate) &'a [u8]);

impl<'a> Der<'a> {
    /// The next element: (tag, content, the whole element).
    pub(crate) fn tlv(&mut self) -> Option<(u8, &'a [u8], &'a [u8])> {
        let b = self.0;
        let tag = *b.first()?;
        if tag & 0x1f == 0x1f {
            return None;
        }
        let l0 = *b.get(1)? as usize;
        let (len, head) = if l0 < 0x80 {
            (l0, 2)
        } else {
            let n = l0 & 0x7f;
            // No indefinite length (BER), at most 4 length bytes, and the shortest form.
            if n == 0 || n > 4 || *b.get(2)? == 0 {
                return None;
            }
            let mut len = 0usize;
            for i in 0..n {
                len = len << 8 | *b.get(2 + i)? as usize;
            }
            if len < 0x80 {
                return None;
            }
            (len, 2 + n)
        };
        let end = head.checked_add(len)?;
        let whole = b.get(..end)?;
        self.0 = &b[end..];
        Some((tag, &whole[head..], whole))
    }

    /// The next element's content, if its tag is `tag`.
    pub(crate) fn expect(&mut self, tag: u8) -> Option<&'a [u8]> {
        match self.tlv()? {
            (t, content, _) if t == tag => Some(content),
            _ => None,
        }
    }
}

impl Der<'_> {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_definite_and_shortest() {
        assert_eq!(Der(&[0x04, 0x01, 0xaa]).expect(0x04), Some(&[0xaa][..]));
        assert!(Der(&[0x30, 0x80, 0x00, 0x00]).tlv().is_none());
        assert!(Der(&[0x04, 0x81, 0x01, 0xaa]).tlv().is_none());
        assert!(Der(&[0x04, 0x05, 0xaa]).tlv().is_none());
        assert!(Der(&[0x1f, 0x01, 0x00]).tlv().is_none());
        let mut two = Der(&[0x02, 0x01, 0x05, 0x04, 0x00]);
        assert_eq!(two.expect(0x02), Some(&[0x05][..]));
        assert_eq!(two.expect(0x04), Some(&[][..]));
        assert!(two.is_empty());
    }
}
