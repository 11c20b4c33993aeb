// The GGML block formats of weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL,
// MXFP4, IQ4_XS, Q2_K, Q3_K), read
// where a kernel reads weights: `block8(row, j)` decodes elements 8j .. 8j + 8 of a weight
// row. Shared by the matmul kernels and the embedding gather, each of which defines
// `wword(i)`, word i of its weight binding, and the WEIGHT_DTYPE override.
//
// On the GPU each GGUF block is kept in a whole number of 4-byte words (gpu_block and
// grouped_row in src/kernels/weight.rs write the layout): the formats of 32-element blocks
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) go in groups of four blocks, the blocks'
// constants in front and each block's codes on a 16-byte word (q32_group below); 14 bytes of
// padding go after a Q6_K block (56 words); Q3_K has its 16 six-bit scales unpacked to bytes
// (words 24..28, then d and two bytes of padding); Q4_K, Q5_K, Q2_K and IQ4_XS blocks are
// whole words as they are. A row is its blocks (or groups) one after another. Rows of Q4_K
// (36 words), Q5_K (44), Q6_K (56) and the grouped formats thus start every block's codes on
// a 16-byte word, and the column kernels (weights8.wgsl) read them 16 bytes at a time. Every
// 8-element group lies within one block and shares its scale, so a group is decoded from a
// few words.
//
// Values are computed with the expressions of src/formats/ggml.rs, the plain-Rust reference,
// and come out as its bits on any conforming GPU: a scale times a code (and Q4_K's and
// Q6_K's super-block scale times a sub-block scale, times a code) needs at most 22
// significant bits, so every product is exact in f32, and where a min is then added or
// subtracted (Q4_1, Q5_1, Q4_K, Q5_K) there is one rounding whether or not the compiler
// fuses the two into a multiply-add (Q2_K's min too). Q3_K's and IQ4_XS's products of a
// super-block scale, a six-bit sub-block scale and a code need at most 20 and 24 bits.
// IQ4_NL's, IQ4_XS's and MXFP4's codes index tables of small integers, times a scale: exact
// products too (MXFP4's scale is a power of two, an f32
// subnormal for exponents 0 and 1, where a GPU that flushes subnormals gives zeros).
// tests/kernels_quant.rs checks every fixture block.

const DTYPE_Q4_0: u32 = 10u;
const DTYPE_Q4_1: u32 = 11u;
const DTYPE_Q5_0: u32 = 12u;
const DTYPE_Q5_1: u32 = 13u;
const DTYPE_Q8_0: u32 = 14u;
const DTYPE_Q4_K: u32 = 15u;
const DTYPE_Q5_K: u32 = 16u;
const DTYPE_Q6_K: u32 = 17u;
const DTYPE_IQ4_NL: u32 = 18u;
const DTYPE_MXFP4: u32 = 19u;
const DTYPE_IQ4_XS: u32 = 20u;
const DTYPE_Q2_K: u32 = 21u;
const DTYPE_Q3_K: u32 = 22u;

// IQ4_NL's 16 levels (src/formats/ggml.rs's IQ4_LEVELS) as i8 bytes of four words: picked
// with selects and a bit extraction rather than an indexed array, which compilers may keep
// in memory (3x slower on lavapipe).
const IQ4_W0: u32 = 0xbfad9881u; // -127 -104 -83 -65
const IQ4_W1: u32 = 0xf6eaddcfu; //  -49  -35 -22 -10
const IQ4_W2: u32 = 0x26190d01u; //    1   13  25  38
const IQ4_W3: u32 = 0x71594535u; //   53   69  89 113

fn iq4_level(q: u32) -> f32 {
    let w = select(select(IQ4_W0, IQ4_W1, q >= 4u), select(IQ4_W2, IQ4_W3, q >= 12u), q >= 8u);
    return f32(extractBits(bitcast<i32>(w), 8u * (q & 3u), 8u));
}

// MXFP4's levels, the E2M1 values doubled: codes 0-7 are 0, 1, 2, 3, 4, 6, 8, 12, codes 8-15
// their negatives (code 8 is +0, as in the table).
fn fp4_level(q: u32) -> f32 {
    let m = q & 7u;
    let mag = select(f32((2u + (m & 1u)) << ((m >> 1u) - 1u)), f32(m), m < 4u);
    return select(mag, -mag, q > 8u);
}

// Whether WEIGHT_DTYPE is a block format.
fn is_block_dtype() -> bool {
    return WEIGHT_DTYPE >= DTYPE_Q4_0;
}

// Elements and words of one block of WEIGHT_DTYPE.
fn block_elems() -> u32 {
    let k = WEIGHT_DTYPE >= DTYPE_Q4_K && WEIGHT_DTYPE <= DTYPE_Q6_K;
    return select(32u, 256u, k || WEIGHT_DTYPE >= DTYPE_IQ4_XS);
}

fn block_words() -> u32 {
    switch WEIGHT_DTYPE {
        case 15u: { return 36u; }
        case 16u: { return 44u; }
        case 20u: { return 34u; }
        case 21u: { return 21u; }
        case 22u: { return 29u; }
        default: { return 56u; }
    }
}

// Whether WEIGHT_DTYPE's 32-element blocks go in groups of four.
fn grouped32() -> bool {
    return (WEIGHT_DTYPE >= DTYPE_Q4_0 && WEIGHT_DTYPE <= DTYPE_Q8_0) || WEIGHT_DTYPE == DTYPE_IQ4_NL || WEIGHT_DTYPE == DTYPE_MXFP4;
}

fn five_bit() -> bool {
    return WEIGHT_DTYPE == DTYPE_Q5_0 || WEIGHT_DTYPE == DTYPE_Q5_1;
}

// A group of four 32-element blocks on the GPU: a 16-byte header of the blocks' constants
// (q32_head), for Q5_0 and Q5_1 the blocks' 32 high bits a word each (words 4..8), then the
// blocks' codes as the file has them, block b's from word q32_codes_at() + q32_code_words() b:
// four words of 4-bit codes (byte l holds element l in its low nibble, l + 16 in its high)
// or Q8_0's eight words of bytes. A row whose blocks are not a multiple of four ends in a
// shorter group of the same layout (its missing constants zero, its codes only its own).
// Four blocks take as many bytes as four file blocks padded to whole words.
fn q32_code_words() -> u32 {
    return select(4u, 8u, WEIGHT_DTYPE == DTYPE_Q8_0);
}

fn q32_codes_at() -> u32 {
    return select(4u, 8u, five_bit());
}

// The first word of block b's group in the row at word `row`.
fn q32_group(row: u32, b: u32) -> u32 {
    return row + (b / 4u) * (q32_codes_at() + 4u * q32_code_words());
}

// The first word of block b's codes.
fn q32_codes(row: u32, b: u32) -> u32 {
    return q32_group(row, b) + q32_codes_at() + q32_code_words() * (b % 4u);
}

// The header word that holds block i's (0..4) constants: Q4_1's and Q5_1's f16 scale and min
// take word i, MXFP4's exponents are byte i of word 0, the others' f16 scales are half i % 2
// of word i / 2.
fn q32_head_word(i: u32) -> u32 {
    if WEIGHT_DTYPE == DTYPE_Q4_1 || WEIGHT_DTYPE == DTYPE_Q5_1 {
        return i;
    }
    return select(i / 2u, 0u, WEIGHT_DTYPE == DTYPE_MXFP4);
}

// Block i's constants from its header word: Q4_1's and Q5_1's scale and min, the others'
// scale in .y.
fn q32_head(word: u32, i: u32) -> vec2<f32> {
    if WEIGHT_DTYPE == DTYPE_Q4_1 || WEIGHT_DTYPE == DTYPE_Q5_1 {
        return unpack2x16float(word);
    }
    if WEIGHT_DTYPE == DTYPE_MXFP4 {
        // 2^(e - 128), built as ggml builds it.
        let e = byte_at(word, i);
        return vec2<f32>(0.0, bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u)));
    }
    let s = unpack2x16float(word);
    return vec2<f32>(0.0, select(s.x, s.y, i % 2u == 1u));
}

// Words of one weight row of k elements.
fn row_words(k: u32) -> u32 {
    if grouped32() {
        let blocks = k / 32u;
        let rest = blocks % 4u;
        return q32_group(0u, blocks) + select(0u, q32_codes_at() + q32_code_words() * rest, rest != 0u);
    }
    return (k / block_elems()) * block_words();
}

// Elements 8g .. 8g + 8 (g in 0..4) of a 32-element block from the two code words that hold
// them (`q`: Q8_0's words 2g and 2g + 1, the 4-bit formats' words 2 (g % 2) and + 1, whose
// nibbles at bit 4 (g / 2) are the codes), the block's high-bit word (Q5_0, Q5_1) and its
// constants (q32_head). The codes are assembled a word at a time, four to a word (a byte
// each), and Q4_0's and Q5_0's code minus 8 or 16 is the code with its top bit flipped read
// as a signed 4- or 5-bit integer: the reference's integer, in two operations.
fn block8_q32(q: vec2<u32>, qh: u32, g: u32, head: vec2<f32>) -> array<vec4<f32>, 2> {
    var v: array<f32, 8>;
    if WEIGHT_DTYPE == DTYPE_Q8_0 {
        for (var i = 0u; i < 8u; i++) {
            v[i] = f32(extractBits(bitcast<i32>(q[i / 4u]), 8u * (i % 4u), 8u)) * head.y;
        }
        return pack8(v);
    }
    let shift = 4u * (g / 2u);
    var c = array<u32, 2>((q.x >> shift) & 0x0f0f0f0fu, (q.y >> shift) & 0x0f0f0f0fu);
    if five_bit() {
        let h = qh >> (8u * g);
        c[0] |= spread4(h & 15u) << 4u;
        c[1] |= spread4((h >> 4u) & 15u) << 4u;
    }
    switch WEIGHT_DTYPE {
        case 10u, 12u: {
            let bits = select(4u, 5u, five_bit());
            let flip = select(0x08080808u, 0x10101010u, five_bit());
            for (var i = 0u; i < 8u; i++) {
                v[i] = f32(extractBits(bitcast<i32>(c[i / 4u] ^ flip), 8u * (i % 4u), bits)) * head.y;
            }
        }
        case 18u: {
            for (var i = 0u; i < 8u; i++) {
                v[i] = head.y * iq4_level(byte_at(c[i / 4u], i % 4u));
            }
        }
        case 19u: {
            for (var i = 0u; i < 8u; i++) {
                v[i] = head.y * fp4_level(byte_at(c[i / 4u], i % 4u));
            }
        }
        default: {
            for (var i = 0u; i < 8u; i++) {
                v[i] = head.x * f32(byte_at(c[i / 4u], i % 4u)) + head.y;
            }
        }
    }
    return pack8(v);
}

// Bits 0..4 of x at bit 0 of bytes 0..4: times 1 + 2^7 + 2^14 + 2^21, bit i lands at bits
// i + 7m (m in 0..4), sixteen different places (so nothing carries), of which bit 8m is
// bit m's.
fn spread4(x: u32) -> u32 {
    return (x * 0x00204081u) & 0x01010101u;
}

// The word in a block's codes where step g's two code words start.
fn q32_step_word(g: u32) -> u32 {
    return select(2u * (g % 2u), 2u * g, WEIGHT_DTYPE == DTYPE_Q8_0);
}

// The constants of block b of the row at word `row`.
fn q32_block_head(row: u32, b: u32) -> vec2<f32> {
    return q32_head(wword(q32_group(row, b) + q32_head_word(b % 4u)), b % 4u);
}

// Elements 8j .. 8j + 8 of the row at word `row` given their block's constants.
fn block8_q32_at(row: u32, j: u32, head: vec2<f32>) -> array<vec4<f32>, 2> {
    let b = j / 4u;
    let at = q32_codes(row, b) + q32_step_word(j % 4u);
    var qh = 0u;
    if five_bit() {
        qh = wword(q32_group(row, b) + 4u + b % 4u);
    }
    return block8_q32(vec2<u32>(wword(at), wword(at + 1u)), qh, j % 4u, head);
}

// Byte i (0..4) of word w.
fn byte_at(w: u32, i: u32) -> u32 {
    return (w >> (8u * i)) & 0xffu;
}

// The eight 4-bit codes at bit `shift` (0 or 4) of each byte of words a, b: masked four at
// a time, then taken byte by byte.
fn nibbles8(a: u32, b: u32, shift: u32) -> array<u32, 8> {
    let a4 = (a >> shift) & 0x0f0f0f0fu;
    let b4 = (b >> shift) & 0x0f0f0f0fu;
    var q: array<u32, 8>;
    for (var i = 0u; i < 4u; i++) {
        q[i] = byte_at(a4, i);
        q[i + 4u] = byte_at(b4, i);
    }
    return q;
}

fn pack8(v: array<f32, 8>) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

// IQ4_XS: group g (0..32) of the super-block at word `base` (as the file has it: d and
// scales_h in word 0, scales_l in word 1, then sub-block s's 16 code bytes at word 2 + 4 s,
// laid out as an IQ4_NL block's).
fn block8_iq4_xs(base: u32, g: u32) -> array<vec4<f32>, 2> {
    let head = wword(base);
    let s = g / 4u;
    let low = (wword(base + 1u) >> (4u * s)) & 0xfu;
    let high = (head >> (16u + 2u * s)) & 3u;
    let dl = unpack2x16float(head).x * f32(i32(low | (high << 4u)) - 32);
    let qs = base + 2u + 4u * s + 2u * (g % 2u);
    let q = nibbles8(wword(qs), wword(qs + 1u), 4u * ((g % 4u) / 2u));
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = dl * iq4_level(q[i]);
    }
    return pack8(v);
}

// Q2_K: group g (0..32) of the super-block at word `base` (the file's layout: 16 scale bytes
// in words 0..4, 64 code bytes in words 4..20, d and dmin in word 20): half n, elements
// 32 j + l .. + 8 of it (l = 8 (g % 4)), codes at bit 2 j of bytes 32 n + l .., in sub-block
// 8 n + 2 j + l / 16 of 16.
fn block8_q2_k(base: u32, g: u32) -> array<vec4<f32>, 2> {
    let n = g / 16u;
    let j = (g % 16u) / 4u;
    let qs = base + 4u + 8u * n + 2u * (g % 4u);
    let a = wword(qs);
    let b = wword(qs + 1u);
    let si = 8u * n + 2u * j + (g % 4u) / 2u;
    let sc = byte_at(wword(base + si / 4u), si % 4u);
    let dm = unpack2x16float(wword(base + 20u));
    let dl = dm.x * f32(sc & 15u);
    let ml = dm.y * f32(sc >> 4u);
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let word = select(b, a, i < 4u);
        v[i] = dl * f32((byte_at(word, i % 4u) >> (2u * j)) & 3u) - ml;
    }
    return pack8(v);
}

// Q3_K: group g (0..32) of the super-block at word `base` (high bits in words 0..8, codes in
// words 8..24 laid out as Q2_K's, the 16 scales unpacked to bytes in words 24..28, d in the
// low half of word 28): as Q2_K, the code minus 4 where its high bit (bit 4 n + j of byte l)
// is clear.
fn block8_q3_k(base: u32, g: u32) -> array<vec4<f32>, 2> {
    let n = g / 16u;
    let j = (g % 16u) / 4u;
    let qs = base + 8u + 8u * n + 2u * (g % 4u);
    let a = wword(qs);
    let b = wword(qs + 1u);
    let ha = wword(base + 2u * (g % 4u));
    let hb = wword(base + 2u * (g % 4u) + 1u);
    let si = 8u * n + 2u * j + (g % 4u) / 2u;
    let sc = byte_at(wword(base + 24u + si / 4u), si % 4u);
    let dl = unpack2x16float(wword(base + 28u)).x * f32(i32(sc) - 32);
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let word = select(b, a, i < 4u);
        let hword = select(hb, ha, i < 4u);
        let low = i32((byte_at(word, i % 4u) >> (2u * j)) & 3u);
        let high = (byte_at(hword, i % 4u) >> (4u * n + j)) & 1u;
        v[i] = dl * f32(select(low - 4, low, high == 1u));
    }
    return pack8(v);
}

// Q4_K and Q5_K: group g (0..32) of the super-block at word `base` (the file's layout: d and
// dmin in word 0, the twelve bytes of packed 6-bit scales and mins in words 1..4, for Q5_K
// the 32 high-bit bytes in words 4..12, then the 128 code bytes): sub-block s = g / 4,
// elements l .. l + 8 of it, l = 8 (g % 4).
fn block8_k_asym(base: u32, g: u32) -> array<vec4<f32>, 2> {
    return block8_k_asym_with(base, g, k_asym_head(base, g));
}

// The scale and min of group g's sub-block in a Q4_K or Q5_K super-block.
fn k_asym_head(base: u32, g: u32) -> vec2<f32> {
    let top = vec4<u32>(wword(base), wword(base + 1u), wword(base + 2u), wword(base + 3u));
    return k_asym_scale_min(top, g);
}

// k_asym_head from the super-block's first 16 bytes `top` (d and dmin, the packed scales):
// sub-block s's 6-bit scale and min as src/formats/ggml.rs's k_scale_min unpacks them, times
// d and dmin.
fn k_asym_scale_min(top: vec4<u32>, g: u32) -> vec2<f32> {
    let dm = unpack2x16float(top.x);
    let s = g / 4u;
    var sc: u32;
    var m: u32;
    if s < 4u {
        sc = k_scale_byte(top, s) & 63u;
        m = k_scale_byte(top, s + 4u) & 63u;
    } else {
        let b = k_scale_byte(top, s + 4u);
        sc = (b & 15u) | ((k_scale_byte(top, s - 4u) >> 6u) << 4u);
        m = (b >> 4u) | ((k_scale_byte(top, s) >> 6u) << 4u);
    }
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(m));
}

// Byte i (0..12) of the packed scales in a K super-block's first 16 bytes.
fn k_scale_byte(top: vec4<u32>, i: u32) -> u32 {
    return byte_at(top[1u + i / 4u], i % 4u);
}

// Word of group g's two code words (`qs`) and, for Q5_K, two high-bit words (`qh`) in the
// super-block at `base`: for an even g each is the first half of a 16-byte word when `base`
// is on one (rows of whole blocks from a 16-byte boundary; Q4_K's 36 and Q5_K's 44 words are
// multiples of 4), and g + 1's are the second halves of the same 16-byte words.
fn k_asym_words(base: u32, g: u32) -> vec2<u32> {
    let s = g / 4u;
    let five = WEIGHT_DTYPE == DTYPE_Q5_K;
    // Nibble byte l of sub-block s: byte 32 (s / 2) + l of the codes, half s % 2.
    return vec2<u32>(base + select(4u, 12u, five) + 8u * (s / 2u) + 2u * (g % 4u), base + 4u + 2u * (g % 4u));
}

// block8_k_asym given k_asym_head's scale and min.
fn block8_k_asym_with(base: u32, g: u32, head: vec2<f32>) -> array<vec4<f32>, 2> {
    let at = k_asym_words(base, g);
    let qs = vec2<u32>(wword(at.x), wword(at.x + 1u));
    var qh = vec2<u32>(0u);
    if WEIGHT_DTYPE == DTYPE_Q5_K {
        qh = vec2<u32>(wword(at.y), wword(at.y + 1u));
    }
    return block8_k_asym_words(qs, qh, g, head);
}

// Group g's eight weights from its code words `qs`, high-bit words `qh` (Q5_K) and its
// sub-block's scale and min.
fn block8_k_asym_words(qs: vec2<u32>, qh: vec2<u32>, g: u32, head: vec2<f32>) -> array<vec4<f32>, 2> {
    // Four codes to a word: the nibbles, and for Q5_K bit s of each high-bit byte above them.
    let s = g / 4u;
    var c = array<u32, 2>((qs.x >> (4u * (s % 2u))) & 0x0f0f0f0fu, (qs.y >> (4u * (s % 2u))) & 0x0f0f0f0fu);
    if WEIGHT_DTYPE == DTYPE_Q5_K {
        c[0] |= ((qh.x >> s) & 0x01010101u) << 4u;
        c[1] |= ((qh.y >> s) & 0x01010101u) << 4u;
    }
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = head.x * f32(byte_at(c[i / 4u], i % 4u)) - head.y;
    }
    return pack8(v);
}

// Q6_K: group g (0..32) of the super-block at word `base` (quant.rs's dequant_q6_k spells out
// the layout): half h, elements e .. e + 8 of it, in quarter k at position l.
fn block8_q6_k(base: u32, g: u32) -> array<vec4<f32>, 2> {
    let dl = q6_k_scale(base, g);
    let six = q6_k_codes(base, g);
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = dl * f32(i32(byte_at(six[i / 4u], i % 4u)) - 32);
    }
    return pack8(v);
}

// The scale of group g's sub-block of 16 in a Q6_K super-block.
fn q6_k_scale(base: u32, g: u32) -> f32 {
    let si = 8u * (g / 16u) + (8u * (g % 16u)) / 16u;
    let sc = extractBits(bitcast<i32>(wword(base + 48u + si / 4u)), 8u * (si % 4u), 8u);
    let d = unpack2x16float(wword(base + 52u)).x;
    return d * f32(sc);
}

// The words of group g's low code bits (x) and high code bits (y) in the Q6_K super-block at
// word `base`: two words from each. For an even g both are the first of a 16-byte word when
// `base` is (56-word blocks from a 16-byte boundary), and g + 1's are the second halves of
// the same two 16-byte words.
fn q6_k_words(base: u32, g: u32) -> vec2<u32> {
    let h = g / 16u;
    let e = 8u * (g % 16u);
    let k = e / 32u;
    let l = e % 32u;
    return vec2<u32>(base + 16u * h + 8u * (k % 2u) + l / 4u, base + 32u + 8u * h + l / 4u);
}

// Each of group g's eight six-bit codes, four to a word, from its two words of low bits `ql`
// and two of high bits `qh`: its low nibble (at bit 4 (k / 2) of its code byte, k the
// quarter) and above it its two high bits (at bit 2 k of its high byte), assembled in place
// a word at a time (no bits cross a byte).
fn q6_k_six(ql: vec2<u32>, qh: vec2<u32>, g: u32) -> array<u32, 2> {
    let k = (g % 16u) / 4u;
    let shift = 4u * (k / 2u);
    return array<u32, 2>(
        ((ql.x >> shift) & 0x0f0f0f0fu) | (((qh.x >> (2u * k)) & 0x03030303u) << 4u),
        ((ql.y >> shift) & 0x0f0f0f0fu) | (((qh.y >> (2u * k)) & 0x03030303u) << 4u),
    );
}

fn q6_k_codes(base: u32, g: u32) -> array<u32, 2> {
    let at = q6_k_words(base, g);
    let ql = vec2<u32>(wword(at.x), wword(at.x + 1u));
    return q6_k_six(ql, vec2<u32>(wword(at.y), wword(at.y + 1u)), g);
}

// The eight weights of codes `six` (q6_k_six) and scale dl, for the kernels that take dot
// products of them: dl (q - 32) computed as dl q - 32 dl. Both products are exact (dl has at
// most 18 significant bits, q 6), so their difference is exact too and equals block8_q6_k's
// value, but for the sign of a zero (+0 here where dl < 0 gives -0 there), which a dot
// product that starts at +0 cannot tell apart: the dot products are the same bits.
fn block8_q6_k_six(six: array<u32, 2>, dl: f32) -> array<vec4<f32>, 2> {
    let off = -32.0 * dl;
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = f32(byte_at(six[i / 4u], i % 4u)) * dl + off;
    }
    return pack8(v);
}

// Elements 8j .. 8j + 8 of the weight row that starts at word `row`.
fn block8(row: u32, j: u32) -> array<vec4<f32>, 2> {
    if grouped32() {
        return block8_q32_at(row, j, q32_block_head(row, j / 4u));
    }
    let base = row + (j / 32u) * block_words();
    let g = j % 32u;
    if WEIGHT_DTYPE == DTYPE_Q6_K {
        return block8_q6_k(base, g);
    }
    if WEIGHT_DTYPE == DTYPE_Q4_K || WEIGHT_DTYPE == DTYPE_Q5_K {
        return block8_k_asym(base, g);
    }
    return block8_single(row, j);
}

// block8 for the formats whose steps have no group constants in common (Q2_K, Q3_K,
// IQ4_XS): the only block formats the kernels that step through groups (weights8.wgsl) read
// one step at a time, with code for just these (a compiler inlines every format's code at
// each call before it drops the other formats').
fn block8_single(row: u32, j: u32) -> array<vec4<f32>, 2> {
    let base = row + (j / 32u) * block_words();
    let g = j % 32u;
    if WEIGHT_DTYPE == DTYPE_Q3_K {
        return block8_q3_k(base, g);
    }
    if WEIGHT_DTYPE == DTYPE_Q2_K {
        return block8_q2_k(base, g);
    }
    return block8_iq4_xs(base, g);
}

// A block format's group constants (a scale, and a min where it has one) stay the same for
// head_steps() consecutive steps j of 8 weights from a multiple of it: a kernel that steps
// through a row computes them once per group (weights8.wgsl's weights_head) and decodes each
// step from them, which gives block8's values bit for bit (the same expressions, computed
// once instead of at every step). Formats whose steps each need their own (Q2_K, Q3_K,
// IQ4_XS) and float formats have one step a group. The 4-bit
// 32-element formats' groups are a block (its codes are one 16-byte word); Q8_0's, Q4_K's,
// Q5_K's and Q6_K's are two steps, whose codes lie in the halves of the same 16-byte words
// (weights8.wgsl's Head holds those).
fn head_steps() -> u32 {
    if grouped32() {
        return select(4u, 2u, WEIGHT_DTYPE == DTYPE_Q8_0);
    }
    return select(1u, 2u, WEIGHT_DTYPE >= DTYPE_Q4_K && WEIGHT_DTYPE <= DTYPE_Q6_K);
}
