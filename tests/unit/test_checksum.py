"""tensor_checksum / tensor_abs_sum against float64 sums written here, and what they must tell apart."""
import torch

from hybridrl.utils.checksum import BLOCK, tensor_abs_sum, tensor_checksum


def _exact(t: torch.Tensor) -> tuple[float, float]:
    values = [float(v) for v in t.detach().reshape(-1).to(torch.float64)]
    return sum(values), sum(abs(v) for v in values)


def test_half_sums_match_float64_sums_of_the_same_values():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for n in (1, BLOCK - 1, BLOCK, 5 * BLOCK + 17):
            # magnitudes over 17 binades: the float32 blocks drop only the smallest members' low bits, a hundred
            # times below the 1e-6 rtol of engines that sum in another order
            t = (torch.randn(n, generator=g) * torch.logspace(-4, 1, n)).to(dtype)
            want, scale = _exact(t)
            assert abs(float(tensor_checksum(t)) - want) <= 1e-8 * scale
            assert abs(float(tensor_abs_sum(t)) - scale) <= 1e-6 * scale  # a tolerance's scale only


def test_one_ulp_of_one_member_moves_the_sum_and_layout_does_not():
    g = torch.Generator().manual_seed(1)
    t = (torch.randn(64, 3 * BLOCK + 5, generator=g) * 0.02).to(torch.bfloat16)  # a weight matrix's spread
    for index in ((17, 100), (0, 0), (63, 3 * BLOCK + 4)):  # inside a block, the first, the tail
        bumped = t.clone()
        bumped.view(torch.int16)[index] += 1  # the next bf16 value of the same sign: one ulp
        assert bumped[index] != t[index]
        assert float(tensor_checksum(bumped)) != float(tensor_checksum(t)), index
    # a strided view sums its values in memory order, as its contiguous copy does: bitwise the same
    view = t.t()
    assert float(tensor_checksum(view)) == float(tensor_checksum(view.contiguous()))


def test_other_dtypes_keep_the_float64_sum():
    t = torch.randn(1000, dtype=torch.float32)
    assert float(tensor_checksum(t)) == float(torch.sum(t, dtype=torch.float64))
    assert float(tensor_abs_sum(t)) == float(torch.sum(t.abs(), dtype=torch.float64))


def test_a_misaligned_start_sums_as_an_aligned_copy():
    """A view starting one element into its storage (2 bytes: not 16-byte aligned) is summed from an aligned copy,
    so its checksum is bitwise the one of the same values held elsewhere."""
    t = (torch.randn(4 * BLOCK + 3) * 0.02).to(torch.bfloat16)
    view = t[1:]
    assert view.data_ptr() % 16 != 0
    assert float(tensor_checksum(view)) == float(tensor_checksum(view.clone()))


def test_many_tensors_at_once_sum_what_one_at_a_time_does(monkeypatch):
    """checksums(): mixed shapes, dtypes, repeats of one shape (stacked together), strided views, a tail shorter than
    a block, an empty tensor; each sum within float64 rounding of tensor_checksum's (their float32 blocks are the
    same), in the order given; a one-ulp change of one member of one stacked tensor moves that sum alone."""
    from hybridrl.utils import checksum
    from hybridrl.utils.checksum import checksums

    g = torch.Generator().manual_seed(2)
    items = [(torch.randn(32, 3 * BLOCK, generator=g) * 0.02).to(torch.bfloat16) for _ in range(4)]
    items += [(torch.randn(7 * BLOCK + 9, 8, generator=g)).to(torch.bfloat16).t(),  # strided
              torch.randn(5, 3, generator=g), torch.zeros(0, dtype=torch.bfloat16),
              (torch.randn(BLOCK - 3, generator=g)).to(torch.float16), items[1][:, :100]]
    sums, abss = checksums(items)
    assert sums.dtype == abss.dtype == torch.float64 and sums.shape == (len(items),)
    for i, t in enumerate(items):
        want, scale = float(tensor_checksum(t)), float(tensor_abs_sum(t))
        assert abs(float(sums[i]) - want) <= 1e-12 * max(scale, 1e-30), i
        assert abs(float(abss[i]) - scale) <= 1e-12 * max(scale, 1e-30), i
    bumped = [t.clone() for t in items[:4]]
    bumped[2].view(torch.int16)[5, 7] += 1
    moved = checksums(bumped)[0] != checksums(items[:4])[0]
    assert moved.tolist() == [False, False, True, False]
    assert checksums([])[0].numel() == 0
    monkeypatch.setattr(checksum, "CHUNK", 1000)  # more than CHUNK elements of one shape: stacked in parts
    many = [torch.full((300,), float(i), dtype=torch.bfloat16) for i in range(7)]
    assert checksums(many)[0].tolist() == [300.0 * i for i in range(7)]
