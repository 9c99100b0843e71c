"""The fan-out threshold's cost model (stories/bench_threshold.py), on a graph worked by hand."""

from stories.bench_threshold import fit_line, model, redis_per_post_us

# author 1: 3 followers (2, 3, 4) and 4 posts; author 2: 1 follower (3) and 1 post; 3 and 4 post nothing
FOLLOWERS = {1: 3, 2: 1, 3: 0, 4: 0}
POSTS = {1: 4, 2: 1, 3: 0, 4: 0}
FOLLOWING = {1: [], 2: [1], 3: [1, 2], 4: [1]}


def test_everyone_fanned_out():
    # inserts: 4 posts x (1 + 3) + 1 post x (1 + 1) = 18 over 5 posts; no celebrity is merged
    assert model(FOLLOWERS, POSTS, FOLLOWING, 10) == (18 / 5, 0.0)


def test_the_author_over_the_threshold_is_merged_at_read_time():
    # threshold 2: author 1 (3 followers) only into its own timeline: 4 x 1 + 1 x 2 = 6 inserts;
    # readers 2, 3, 4 each merge author 1: 3 sources over 4 readers
    assert model(FOLLOWERS, POSTS, FOLLOWING, 2) == (6 / 5, 3 / 4)


def test_no_fan_out_at_all():
    # threshold 0: both authors merged; sources: 0 + 1 + 2 + 1 = 4 over 4 readers
    assert model(FOLLOWERS, POSTS, FOLLOWING, 0) == (5 / 5, 1.0)


def test_cost_per_post():
    # 10 inserts x 2 us + 5 reads per post x (100 us + 3 sources x 4 us) = 20 + 560
    assert redis_per_post_us(10, 3, 5, c_insert=2, c_read=100, c_source=4) == 580


def test_fit_line():
    assert fit_line([0, 1, 2, 3], [1, 3, 5, 7]) == (1.0, 2.0)
    assert fit_line([2, 2], [4, 6]) == (5.0, 0.0)  # x does not vary: the mean, no slope
