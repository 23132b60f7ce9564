import numpy as np
import pytest

from core.errors import HeadLabError
from core.heads import HeadSet, head_name, parse_heads


def test_parse_list_and_wildcard():
    assert parse_heads("L1H3, L2H0").heads == ((1, 3), (2, 0))
    assert parse_heads("l2h*", n_layers=4, n_heads=3).heads == ((2, 0), (2, 1), (2, 2))
    assert parse_heads("L0H1 L0H1;L0H0").heads == ((0, 0), (0, 1))


@pytest.mark.parametrize("text", ["", "L1", "H3", "L1H", "layer1head2", "L1H3,,X"])
def test_malformed_text_is_one_clear_error(text):
    with pytest.raises(HeadLabError, match="L1H3"):
        parse_heads(text)


def test_head_outside_model():
    with pytest.raises(HeadLabError, match="L9H0 is outside this model"):
        parse_heads("L9H0", n_layers=4, n_heads=4)


def test_wildcard_needs_shape():
    with pytest.raises(HeadLabError, match="model shape"):
        parse_heads("L2H*")


def test_mask_roundtrip_and_json():
    heads = HeadSet.of([(2, 1), (0, 3), (2, 1)])
    assert heads.heads == ((0, 3), (2, 1))
    mask = heads.mask(3, 4)
    assert mask.sum() == 2 and mask[0, 3] and mask[2, 1]
    assert HeadSet.from_mask(mask) == heads
    assert HeadSet.from_json(heads.to_json()) == heads
    assert str(heads) == "L0H3,L2H1"
    assert heads.count_per_layer() == {0: 1, 2: 1}
    assert heads.layers == (0, 2)
    assert head_name((3, 7)) == "L3H7"
    assert np.array_equal(HeadSet().mask(2, 2), np.zeros((2, 2), bool))


def test_toggled_adds_absent_heads_and_removes_present_ones():
    picked = HeadSet(((1, 0), (0, 2)))
    assert picked.toggled([(1, 3)]) == HeadSet(((0, 2), (1, 0), (1, 3)))  # a click on a new head adds it
    assert picked.toggled([(1, 0)]) == HeadSet(((0, 2),))  # a click on a selected head removes it
    assert picked.toggled([(0, 2), (2, 2)]) == HeadSet(((1, 0), (2, 2)))
    assert HeadSet().toggled([(0, 0)]).toggled([(0, 0)]) == HeadSet()
    assert picked.union([(1, 0), (2, 1)]) == HeadSet(((0, 2), (1, 0), (2, 1)))  # a box adds, never removes
