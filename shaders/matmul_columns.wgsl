// Shared by the column kernels (matmul_skinny*.wgsl), which are compiled with this text
// (and matmul_store.wgsl: parameters, outputs, the store of one element) prepended: their
// contract and the store of a pass's rows.
//
// y[m, n_offset + n] = (accumulate ? y : 0) + sum_k x[m, k] * w[n, k] + bias[n_offset + n],
// the contract of matmul.wgsl, for rows first_row .. m (the launcher sends the 8-row passes
// and the remainder as two dispatches, each with its own range). One invocation per output
// column (two in the _vec and _sg kernels; 2-D grid when the columns exceed the dispatch
// limit) reads the column's weights once per ROWS rows of x. Each output is summed over k
// one term at a time, in increasing k, with the same expression as matmul.wgsl (acc += x *
// w, then + bias, then + y), so a row's result is bitwise the same whichever kernel and
// pass computes it: batch invariance survives.

override WEIGHT_DTYPE: u32 = 0u;
// Rows per pass (1, 2, 4 or 8), fixed per pipeline so the row loops unroll into registers.
override ROWS: u32 = 1u;

// Writes the pass's rows r0 .. r0 + ROWS (those below m) of column c.
fn store_rows(r0: u32, c: u32, acc: array<f32, 8>) {
    for (var r = 0u; r < ROWS; r++) {
        if r0 + r < p.m {
            store_output(r0 + r, p.n_offset + c, acc[r]);
        }
    }
}
