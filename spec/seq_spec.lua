-- dl.seq: the dual-chunk split and its inverse, the rank-order <-> sequence
-- order reorders, thd padding, partition indices and per-rank seqlens. The
-- expected layouts are computed here token by token from the definition
-- (rank r holds chunks r and 2C-1-r of every sequence), independently of the
-- chunk copies the module does; values are exact (arange), so checks are exact.
local dl = require "distlab"
local H = require "helpers"

-- Positions (0-based) rank r holds of a sequence of length n, in order.
local function positions(n, r, C)
  local c, out = n / (2 * C), {}
  for _, chunk in ipairs({ r, 2 * C - 1 - r }) do
    for j = 0, c - 1 do out[#out + 1] = chunk * c + j end
  end
  return out
end

-- x's slices along dim at the given 0-based positions, stacked in order.
local function gather(x, dim, pos)
  local shape = x.shape
  shape[dim] = #pos
  local out = dl.empty(shape, { dtype = x.dtype, device = x.device })
  for i, p in ipairs(pos) do out:narrow(dim, i, 1):copy_(x:narrow(dim, p + 1, 1)) end
  return out
end

local function iota(shape, D)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return dl.arange(n, { dtype = "f32", device = D }):view(shape)
end

local function i32(v, D) return dl.from_table(v, { dtype = "i32", device = D }) end

describe("seq's split on Lua numbers (what dl.cp's plans use)", function()
  it("gives every rank's chunks, where sequences start in a part, and the valid tokens of a chunk", function()
    local C, p, lens = 3, { 6, 12, 12, 36 }, { 5, 0, 13 }
    local c, at = dl.seq.chunk_sizes(p, C)
    assert.same({ 1, 0, 4 }, c)
    assert.same({ 0, 2, 2, 10 }, at)
    for r = 0, C - 1 do
      local want, got, valid = {}, {}, {}
      for i = 1, #p - 1 do
        local n = 0
        for _, pos in ipairs(positions(p[i + 1] - p[i], r, C)) do
          want[#want + 1] = { p[i] + pos, #want }
          if pos < lens[i] then n = n + 1 end
        end
        valid[i] = n
      end
      for _, s in ipairs(dl.seq.chunk_segments(p, r, C)) do
        for j = 0, s[3] - 1 do got[#got + 1] = { s[1] + j, s[2] + j } end
      end
      assert.same(want, got)
      for i = 1, #p - 1 do
        assert.equal(valid[i], dl.seq.chunk_valid(lens[i], c[i], r) + dl.seq.chunk_valid(lens[i], c[i], 2 * C - 1 - r))
      end
    end
  end)
end)

for _, dev in ipairs(H.devices) do
  local D = dev.name
  describe("seq on " .. D .. dev.tag, function()
    for _, case in ipairs({ { "bshd", { 2, 12, 3, 2 } }, { "sbhd", { 8, 2, 1, 4 } } }) do
      local layout, shape = case[1], case[2]
      local sd = layout == "bshd" and 2 or 1
      for _, C in ipairs({ 1, 2, 3 }) do
        if shape[sd] % (2 * C) == 0 then
          it(string.format("%s: dual chunks, inverse and reorders for C=%d", layout, C), function()
            local x = iota(shape, D)
            local parts, rank_order = {}, {}
            for r = 0, C - 1 do
              parts[r + 1] = dl.seq.dual_chunk(x, r, C, layout)
              assert.tensor_near(gather(x, sd, positions(shape[sd], r, C)), parts[r + 1], 0, 0)
              for _, p in ipairs(positions(shape[sd], r, C)) do rank_order[#rank_order + 1] = p end
            end
            assert.tensor_near(x, dl.seq.dual_unchunk(parts, C, layout), 0, 0)
            local ro = dl.seq.to_rank_order(x, C, layout)
            assert.tensor_near(gather(x, sd, rank_order), ro, 0, 0)
            assert.tensor_near(x, dl.seq.to_sequence_order(ro, C, layout), 0, 0)
          end)
        end
      end
    end

    it("pads thd sequences to multiples of 2C and moves rows there and back", function()
      local cu = i32({ 0, 3, 3, 10, 11 }, D)
      local cup = dl.seq.thd_pad(cu, 2)
      assert.same({ 0, 4, 4, 12, 16 }, cup:tolist())
      assert.equal(D, cup.device)
      local x = iota({ 11, 2, 3 }, D)
      local xp = dl.seq.thd_pad_rows(x, cu, cup)
      assert.same({ 16, 2, 3 }, xp.shape)
      for row, s in ipairs({ 0, 1, 2, -1, 3, 4, 5, 6, 7, 8, 9, -1, 10, -1, -1, -1 }) do
        local want = s < 0 and dl.zeros(1, 2, 3) or x:narrow(1, s + 1, 1)
        assert.tensor_near(want, xp:narrow(1, row, 1), 0, 0)
      end
      assert.tensor_near(x, dl.seq.thd_unpad_rows(xp, cu, cup), 0, 0)
    end)

    it("splits thd by rank, with partition indices, local seqlens and reorders", function()
      local C, lens = 2, { 3, 0, 7, 1 }
      local cu = i32({ 0, 3, 3, 10, 11 }, D)
      local cup = dl.seq.thd_pad(cu, C)
      local p = cup:tolist()
      local x = iota({ p[#p], 3, 2 }, D)
      local parts, rank_rows = {}, {}
      for r = 0, C - 1 do
        local rows, valid = {}, {}
        for i = 1, #lens do
          local n = 0
          for _, pos in ipairs(positions(p[i + 1] - p[i], r, C)) do
            rows[#rows + 1] = p[i] + pos
            if pos < lens[i] then n = n + 1 end
          end
          valid[i] = n
        end
        local idx = dl.seq.thd_partition_indices(cup, r, C)
        assert.same(rows, idx:tolist())
        parts[r + 1] = dl.seq.thd_dual_chunk(x, cup, r, C)
        assert.tensor_near(gather(x, 1, rows), parts[r + 1], 0, 0)
        local lcu, lcup = dl.seq.thd_local_seqlens(cu, cup, r, C)
        local want_cu, want_cup = { 0 }, { 0 }
        for i = 1, #lens do
          want_cu[i + 1] = want_cu[i] + valid[i]
          want_cup[i + 1] = want_cup[i] + (p[i + 1] - p[i]) / C
        end
        assert.same(want_cu, lcu:tolist())
        assert.same(want_cup, lcup:tolist())
        for _, row in ipairs(rows) do rank_rows[#rank_rows + 1] = row end
      end
      assert.tensor_near(x, dl.seq.thd_dual_unchunk(parts, cup, C), 0, 0)
      local ro = dl.seq.thd_to_rank_order(x, cup, C)
      assert.tensor_near(gather(x, 1, rank_rows), ro, 0, 0)
      assert.tensor_near(x, dl.seq.thd_to_sequence_order(ro, cup, C), 0, 0)
    end)

    it("handles padded offsets that do not start at 0", function()
      local cup = i32({ 4, 8, 16 }, D)
      local x = iota({ 16, 1, 2 }, D)
      local part = dl.seq.thd_dual_chunk(x, cup, 1, 2)
      assert.tensor_near(gather(x, 1, { 5, 6, 10, 11, 12, 13 }), part, 0, 0)
      assert.same({ 5, 6, 10, 11, 12, 13 }, dl.seq.thd_partition_indices(cup, 1, 2):tolist())
      local full = dl.seq.thd_dual_unchunk({ dl.seq.thd_dual_chunk(x, cup, 0, 2), part }, cup, 2)
      assert.tensor_near(x:narrow(1, 5, 12), full, 0, 0)
    end)

    it("refuses what it cannot split", function()
      local x = iota({ 2, 10, 1, 2 }, D)
      assert.error_matches(function() dl.seq.dual_chunk(x, 0, 2) end,
        "seq.dual_chunk: sequence length 10 is not divisible by 2C = 4", 1, true)
      assert.error_matches(function() dl.seq.dual_chunk(x, 2, 2) end, "rank 2 is not below the CP size 2", 1, true)
      assert.error_matches(function() dl.seq.dual_chunk(x, 0, 1, "thd") end, "layout thd is not bshd or sbhd", 1, true)
      assert.error_matches(function() dl.seq.thd_dual_chunk(x, i32({ 0, 6 }, D), 0, 2) end,
        "padded length 6 of sequence 1 is not a multiple of 2C = 4 (use seq.thd_pad)", 1, true)
      assert.error_matches(function() dl.seq.thd_pad(i32({ 0, 5, 2 }, D), 2) end,
        "cu_seqlens decreases at entry 3 (2 after 5)", 1, true)
      assert.error_matches(function() dl.seq.thd_pad_rows(x, i32({ 0, 5 }, D), i32({ 0, 4 }, D)) end,
        "sequence 1 has 5 tokens but 4 padded rows", 1, true)
    end)
  end)
end
