//! A strict reader of the one Java serialization stream Kafka Connect's
//! `org.apache.kafka.connect.storage.FileOffsetBackingStore` writes (Debezium Server and the
//! embedded engine keep their source offsets in it): an `ObjectOutputStream` holding one
//! `java.util.HashMap<byte[], byte[]>`.
//!
//! The shape (Java Object Serialization Specification, chapter 6 "Object Serialization Stream
//! Protocol", and `java.util.HashMap.writeObject`):
//!
//! ```text
//! AC ED 00 05                          magic, version 5
//! 73 72 "java.util.HashMap" SUID 03    TC_OBJECT, TC_CLASSDESC, SC_WRITE_METHOD|SC_SERIALIZABLE
//!    00 02 'F' "loadFactor" 'I' "threshold" 78 70   fields, TC_ENDBLOCKDATA, no superclass
//!    <float loadFactor> <int threshold>
//!    77 08 <int capacity> <int size>   TC_BLOCKDATA (HashMap.writeObject)
//!    size × (key, value)               each TC_ARRAY of class "[B" (the first with its
//!                                      TC_CLASSDESC, later ones TC_REFERENCE to it) + int
//!                                      length + bytes, or TC_NULL
//!    78                                TC_ENDBLOCKDATA
//! ```
//!
//! Anything else (another class, another element type, a truncated file, trailing bytes) is
//! refused with what was found at which byte offset. (A general reader, the `jaded` crate, was
//! considered: it returns `HashMap`'s custom-written data as raw annotation blocks, so decoding
//! the entries would still be ours, for a dependency maintained by one person.)

/// `java.util.HashMap`'s `serialVersionUID`.
const HASHMAP_SUID: u64 = 362_498_820_763_181_265;
/// `byte[]`'s `serialVersionUID` (class name `[B`).
const BYTE_ARRAY_SUID: u64 = 0xACF3_17F8_0608_54E0;
/// The first handle a stream assigns.
const BASE_HANDLE: u32 = 0x7E_0000;

const TC_NULL: u8 = 0x70;
const TC_REFERENCE: u8 = 0x71;
const TC_CLASSDESC: u8 = 0x72;
const TC_OBJECT: u8 = 0x73;
const TC_ARRAY: u8 = 0x75;
const TC_BLOCKDATA: u8 = 0x77;
const TC_ENDBLOCKDATA: u8 = 0x78;
const TC_BLOCKDATALONG: u8 = 0x7A;

/// One key or value of the map: its bytes, or `None` for a Java `null`.
pub type Bytes = Option<Vec<u8>>;

/// What a handle refers to.
enum Handle {
    /// The class descriptor of `java.util.HashMap`.
    HashMapClass,
    /// The class descriptor of `byte[]`.
    ByteArrayClass,
    /// The map object itself.
    Map,
    /// A `byte[]` read earlier (its index in `arrays`).
    Array(usize),
}

struct Stream<'a> {
    bytes: &'a [u8],
    at: usize,
    handles: Vec<Handle>,
    arrays: Vec<Vec<u8>>,
    /// Bytes of keys and values handed out so far: references to one array could otherwise
    /// multiply a small file into any amount of memory.
    produced: usize,
}

/// The most key and value bytes an offset file may hold: Debezium's offsets are a few hundred
/// bytes per connector.
const MAX_PRODUCED: usize = 64 << 20;

impl<'a> Stream<'a> {
    /// Counts `n` more bytes handed out, refusing more than [`MAX_PRODUCED`].
    fn produce(&mut self, n: usize, at: usize) -> Result<(), String> {
        self.produced = self.produced.saturating_add(n);
        if self.produced > MAX_PRODUCED {
            return Err(format!(
                "the entries reach more than {} MiB at byte {at}: not an offset file of \
                 Debezium (its offsets are a few hundred bytes per connector)",
                MAX_PRODUCED >> 20
            ));
        }
        Ok(())
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "the file ends at byte {} inside {what} ({n} bytes needed at {}): truncated?",
                self.bytes.len(),
                self.at
            ));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, String> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A modified-UTF-8 string with a 2-byte length (class and field names: ASCII here).
    fn utf(&mut self, what: &str) -> Result<String, String> {
        let n = usize::from(self.u16(what)?);
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not valid UTF-8"))
    }

    fn expect(&mut self, tag: u8, what: &str) -> Result<(), String> {
        let at = self.at;
        let got = self.u8(what)?;
        if got == tag {
            Ok(())
        } else {
            Err(format!(
                "expected {what} (0x{tag:02X}) at byte {at}, found 0x{got:02X}"
            ))
        }
    }

    fn assign(&mut self, h: Handle) {
        self.handles.push(h);
    }

    fn handle(&mut self, what: &str) -> Result<&Handle, String> {
        let at = self.at;
        let h = self.u32(what)?;
        h.checked_sub(BASE_HANDLE)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.handles.get(i))
            .ok_or_else(|| format!("{what} at byte {at} refers to unknown handle 0x{h:08X}"))
    }

    /// A class descriptor with no fields that are objects: name, SUID, flags, primitive fields
    /// (type code, name), then TC_ENDBLOCKDATA (no annotations) and TC_NULL (no superclass).
    fn class_desc(
        &mut self,
        name: &str,
        suid: u64,
        flags: u8,
        fields: &[(u8, &str)],
    ) -> Result<(), String> {
        let at = self.at;
        let found = self.utf("a class name")?;
        if found != name {
            return Err(format!(
                "expected class {name} at byte {at}, found class {found:?}: not a \
                 FileOffsetBackingStore file (a HashMap<byte[],byte[]>)"
            ));
        }
        let got_suid = self.u64("a serialVersionUID")?;
        if got_suid != suid {
            return Err(format!(
                "class {name} has serialVersionUID {got_suid:#x}, expected {suid:#x}"
            ));
        }
        let got_flags = self.u8("class flags")?;
        if got_flags != flags {
            return Err(format!(
                "class {name} has flags 0x{got_flags:02X}, expected 0x{flags:02X}"
            ));
        }
        let n = self.u16("a field count")?;
        if usize::from(n) != fields.len() {
            return Err(format!(
                "class {name} has {n} serialized fields, expected {}",
                fields.len()
            ));
        }
        for (code, field) in fields {
            let c = self.u8("a field type code")?;
            let f = self.utf("a field name")?;
            if c != *code || f != *field {
                return Err(format!(
                    "class {name}: field {:?} {f:?}, expected {:?} {field:?}",
                    char::from(c),
                    char::from(*code)
                ));
            }
        }
        self.expect(TC_ENDBLOCKDATA, "the end of the class annotations")?;
        self.expect(TC_NULL, "no superclass (TC_NULL)")?;
        Ok(())
    }

    /// A `byte[]` object or `null`.
    fn bytes_object(&mut self, what: &str) -> Result<Bytes, String> {
        let at = self.at;
        match self.u8(what)? {
            TC_NULL => Ok(None),
            TC_ARRAY => {
                let class_at = self.at;
                match self.u8("the array's class")? {
                    TC_CLASSDESC => {
                        self.class_desc("[B", BYTE_ARRAY_SUID, 0x02, &[])?;
                        self.assign(Handle::ByteArrayClass);
                    }
                    TC_REFERENCE => {
                        if !matches!(self.handle("the array's class")?, Handle::ByteArrayClass) {
                            return Err(format!(
                                "the array at byte {at} is not a byte[] (its class reference \
                                 at byte {class_at} names another class)"
                            ));
                        }
                    }
                    t => {
                        return Err(format!(
                            "expected the array's class at byte {class_at}, found 0x{t:02X}"
                        ))
                    }
                }
                let len_at = self.at;
                let len = self.u32("an array length")?;
                let len = usize::try_from(i32::from_be_bytes(len.to_be_bytes()))
                    .map_err(|_| format!("negative array length at byte {len_at}"))?;
                let b = self.take(len, what)?.to_vec();
                self.produce(b.len(), at)?;
                self.arrays.push(b.clone());
                let index = self.arrays.len() - 1;
                self.assign(Handle::Array(index));
                Ok(Some(b))
            }
            TC_REFERENCE => match self.handle(what)? {
                Handle::Array(i) => {
                    let i = *i;
                    let b = self.arrays.get(i).cloned();
                    self.produce(b.as_ref().map_or(0, Vec::len), at)?;
                    Ok(b)
                }
                _ => Err(format!(
                    "{what} at byte {at} refers to an object that is not a byte[]"
                )),
            },
            t => Err(format!(
                "expected {what} (a byte[] or null) at byte {at}, found 0x{t:02X}"
            )),
        }
    }
}

/// The entries of a `FileOffsetBackingStore` file, in stream order (which is `HashMap`
/// iteration order, not insertion order): (key, value) with `None` for a Java `null`.
///
/// # Errors
/// A description of the first byte that does not fit the shape above, with its offset.
pub fn read_offset_file(bytes: &[u8]) -> Result<Vec<(Bytes, Bytes)>, String> {
    let mut s = Stream {
        bytes,
        at: 0,
        handles: Vec::new(),
        arrays: Vec::new(),
        produced: 0,
    };
    let magic = s.u16("the stream magic")?;
    let version = s.u16("the stream version")?;
    if magic != 0xACED || version != 5 {
        return Err(format!(
            "not a Java serialization stream (starts with {magic:04X} {version:04X}, expected \
             ACED 0005)"
        ));
    }
    s.expect(TC_OBJECT, "an object (TC_OBJECT)")?;
    s.expect(TC_CLASSDESC, "a class descriptor (TC_CLASSDESC)")?;
    s.class_desc(
        "java.util.HashMap",
        HASHMAP_SUID,
        0x03,
        &[(b'F', "loadFactor"), (b'I', "threshold")],
    )?;
    s.assign(Handle::HashMapClass);
    s.assign(Handle::Map);
    let _load_factor = s.u32("loadFactor")?;
    let _threshold = s.u32("threshold")?;
    let block_at = s.at;
    let block_len = match s.u8("HashMap's block data")? {
        TC_BLOCKDATA => u32::from(s.u8("a block length")?),
        TC_BLOCKDATALONG => s.u32("a block length")?,
        t => {
            return Err(format!(
                "expected HashMap's block data (capacity, size) at byte {block_at}, found \
                 0x{t:02X}"
            ))
        }
    };
    if block_len != 8 {
        return Err(format!(
            "HashMap's block data at byte {block_at} has {block_len} bytes, expected 8 \
             (capacity, size)"
        ));
    }
    let _capacity = s.u32("HashMap's capacity")?;
    let size_at = s.at;
    let size = i32::from_be_bytes(s.u32("HashMap's size")?.to_be_bytes());
    let size = usize::try_from(size)
        .map_err(|_| format!("negative HashMap size {size} at byte {size_at}"))?;
    let mut entries = Vec::with_capacity(size.min(1024));
    for i in 0..size {
        let key = s.bytes_object(&format!("the key of entry {i}"))?;
        let value = s.bytes_object(&format!("the value of entry {i}"))?;
        entries.push((key, value));
    }
    s.expect(TC_ENDBLOCKDATA, "the end of the map (TC_ENDBLOCKDATA)")?;
    if s.at != bytes.len() {
        return Err(format!(
            "{} bytes after the map (from byte {}): not a FileOffsetBackingStore file",
            bytes.len() - s.at,
            s.at
        ));
    }
    Ok(entries)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stream as `ObjectOutputStream.writeObject(HashMap<byte[],byte[]>)` writes it.
    pub(crate) fn write_offset_file(entries: &[(Bytes, Bytes)]) -> Vec<u8> {
        let mut b = vec![0xAC, 0xED, 0x00, 0x05, TC_OBJECT, TC_CLASSDESC];
        let name = b"java.util.HashMap";
        b.extend_from_slice(&(name.len() as u16).to_be_bytes());
        b.extend_from_slice(name);
        b.extend_from_slice(&HASHMAP_SUID.to_be_bytes());
        b.extend_from_slice(&[0x03, 0x00, 0x02, b'F']);
        b.extend_from_slice(&10u16.to_be_bytes());
        b.extend_from_slice(b"loadFactor");
        b.push(b'I');
        b.extend_from_slice(&9u16.to_be_bytes());
        b.extend_from_slice(b"threshold");
        b.extend_from_slice(&[TC_ENDBLOCKDATA, TC_NULL]);
        b.extend_from_slice(&0.75f32.to_bits().to_be_bytes());
        b.extend_from_slice(&12i32.to_be_bytes());
        b.extend_from_slice(&[TC_BLOCKDATA, 8]);
        b.extend_from_slice(&16i32.to_be_bytes());
        b.extend_from_slice(&(entries.len() as i32).to_be_bytes());
        let mut class_written = false;
        for (k, v) in entries {
            for x in [k, v] {
                match x {
                    None => b.push(TC_NULL),
                    Some(bytes) => {
                        b.push(TC_ARRAY);
                        if class_written {
                            b.push(TC_REFERENCE);
                            b.extend_from_slice(&(BASE_HANDLE + 2).to_be_bytes());
                        } else {
                            b.push(TC_CLASSDESC);
                            b.extend_from_slice(&2u16.to_be_bytes());
                            b.extend_from_slice(b"[B");
                            b.extend_from_slice(&BYTE_ARRAY_SUID.to_be_bytes());
                            b.extend_from_slice(&[0x02, 0x00, 0x00, TC_ENDBLOCKDATA, TC_NULL]);
                            class_written = true;
                        }
                        b.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
                        b.extend_from_slice(bytes);
                    }
                }
            }
        }
        b.push(TC_ENDBLOCKDATA);
        b
    }

    #[test]
    fn reads_entries_with_references_and_nulls() {
        let entries = vec![
            (
                Some(b"[\"a\",{\"server\":\"s\"}]".to_vec()),
                Some(b"{}".to_vec()),
            ),
            (Some(b"k2".to_vec()), None),
            (Some(Vec::new()), Some(b"v3".to_vec())),
        ];
        let bytes = write_offset_file(&entries);
        assert_eq!(read_offset_file(&bytes), Ok(entries));
        assert_eq!(read_offset_file(&write_offset_file(&[])), Ok(Vec::new()));
    }

    #[test]
    fn references_cannot_multiply_a_small_file() {
        // One 1 MiB array, then 100 entries whose key and value refer back to it: a file of
        // about 1 MiB that would hand out 200 MiB.
        let big = vec![b'x'; 1 << 20];
        let mut b = write_offset_file(&[(Some(big), Some(b"v".to_vec()))]);
        let end = b.pop();
        assert_eq!(end, Some(TC_ENDBLOCKDATA));
        let size_at = b
            .windows(2)
            .position(|w| w == [TC_BLOCKDATA, 8])
            .expect("block data")
            + 2
            + 4;
        b[size_at..size_at + 4].copy_from_slice(&101i32.to_be_bytes());
        for _ in 0..200 {
            b.push(TC_REFERENCE);
            b.extend_from_slice(&(BASE_HANDLE + 3).to_be_bytes());
        }
        b.push(TC_ENDBLOCKDATA);
        let e = read_offset_file(&b).expect_err("too much");
        assert!(e.contains("not an offset file of Debezium"), "{e}");
    }

    #[test]
    fn refuses_other_shapes_with_the_offset() {
        let good = write_offset_file(&[(Some(b"k".to_vec()), Some(b"v".to_vec()))]);
        let e = read_offset_file(&good[..good.len() - 3]).expect_err("truncated");
        assert!(e.contains("truncated"), "{e}");
        let mut trailing = good.clone();
        trailing.push(0);
        let e = read_offset_file(&trailing).expect_err("trailing");
        assert!(e.contains("1 bytes after the map"), "{e}");
        let e = read_offset_file(b"{\"not\":\"java\"}").expect_err("json");
        assert!(e.contains("not a Java serialization stream"), "{e}");
        let mut other = good.clone();
        // java.util.HashMap -> java.util.HashSet (same length)
        other[8 + 10..8 + 17].copy_from_slice(b"HashSet");
        let e = read_offset_file(&other).expect_err("other class");
        assert!(e.contains("found class \"java.util.HashSet\""), "{e}");
        let mut bad_ref = good;
        let at = bad_ref.len() - 1 - 1 - 4 - 2;
        bad_ref[at] = TC_REFERENCE;
        assert!(read_offset_file(&bad_ref).is_err());
    }
}
