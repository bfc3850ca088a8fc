"""The logical plan model and OM-style plan enumeration (Kulkarni & Ravishankar §4.2)."""
import itertools
import math
import pickle

import pytest

from pyspark_cq import plan as P


def canonical(tree):
    """A tree of names as nested frozensets: equal for trees that differ only by commutativity."""
    if isinstance(tree, str):
        return tree
    return frozenset([canonical(tree[0]), canonical(tree[1])])


def leaves(tree):
    return [tree] if isinstance(tree, str) else leaves(tree[0]) + leaves(tree[1])


def double_factorial(n):
    return math.prod(range(n, 0, -2)) if n > 0 else 1


# --------------------------------------------------------------------------------------- nodes


def test_render_and_symbols():
    plan = P.Aggregate(P.Join(P.Select(P.Source("A"), 0.5), P.Window(P.Source("B"), 60)), groups=10)
    assert P.render(plan) == "γ[10]((σ[0.5](A) ⋈ ω[60](B)))"
    assert str(P.Aggregate(P.Source("A"))) == "α(A)"
    assert P.render(P.Union((P.Source("A"), P.Granularity(P.Project(P.Source("B")), 5)))) == "∪(A, Γ[5](π(B)))"
    assert P.render(P.Window(P.Source("A"), 3, kind="tuple")) == "ω[3rows](A)"


def test_traversals():
    a, b, c = P.Source("A"), P.Source("B"), P.Source("C")
    j1 = P.Join(a, b, label="j1")
    root = P.Select(P.Join(j1, P.Project(c, label="p")), 0.5, label="root")
    post = list(P.postorder(root))
    # children before parents, every node once
    assert len(post) == 7 and post[-1] is root
    for i, node in enumerate(post):
        for child in node.children:
            assert any(child is n for n in post[:i])
    bfs = P.breadth_first(root)
    assert bfs[0] is root and [n.label for n in bfs if n.label] == ["root", "j1", "p"]
    assert len(P.breadth_first(root, include_sources=True)) == 7
    assert P.source_names(root) == ("A", "B", "C")


def test_nodes_are_immutable_hashable_picklable():
    plan = P.Join(P.Select(P.Source("A"), 0.1, cost=0.02), P.Source("B"), selectivity=0.01)
    assert plan == P.Join(P.Select(P.Source("A"), 0.1, cost=0.02), P.Source("B"), selectivity=0.01)
    assert len({plan, pickle.loads(pickle.dumps(plan))}) == 1
    with pytest.raises(AttributeError):
        plan.selectivity = 0.5
    assert plan.replace(method="nested_loops").method == "nested_loops"


@pytest.mark.parametrize("make, exc, words", [
    (lambda: P.Source(""), TypeError, "name"),
    (lambda: P.Select(P.Source("A"), 0.0), ValueError, "selectivity"),
    (lambda: P.Select(P.Source("A"), 1.5), ValueError, "selectivity"),
    (lambda: P.Select(P.Source("A"), "0.5"), TypeError, "selectivity"),
    (lambda: P.Select("A", 0.5), TypeError, "child"),
    (lambda: P.Project(P.Source("A"), cost=-1), ValueError, "cost"),
    (lambda: P.Join(P.Source("A"), P.Source("B"), method="merge"), ValueError, "method"),
    (lambda: P.Join(P.Source("A"), None), TypeError, "right"),
    (lambda: P.Aggregate(P.Source("A"), groups=0), ValueError, "groups"),
    (lambda: P.Window(P.Source("A"), -1), ValueError, "size"),
    (lambda: P.Window(P.Source("A"), 2.5, kind="tuple"), TypeError, "size"),
    (lambda: P.Window(P.Source("A"), 2, kind="session"), ValueError, "kind"),
    (lambda: P.Granularity(P.Source("A"), 0), ValueError, "granularity"),
    (lambda: P.Union((P.Source("A"),)), ValueError, "inputs"),
    (lambda: P.Source("A", label=3), TypeError, "label"),
])
def test_node_validation(make, exc, words):
    with pytest.raises(exc, match=words):
        make()


# --------------------------------------------------------------------------------------- join orders


@pytest.mark.parametrize("k", range(1, 7))
def test_left_deep_orders_count_and_uniqueness(k):
    names = tuple("ABCDEF"[:k])
    orders = P.left_deep_orders(names)
    assert len(orders) == (math.factorial(k) // 2 if k > 1 else 1)
    trees = P.join_trees(names, "left_deep")
    assert len({canonical(t) for t in trees}) == len(trees)
    # every left-deep tree up to commutativity is there: compare with all permutations
    expected = set()
    for perm in itertools.permutations(names):
        tree = perm[0]
        for s in perm[1:]:
            tree = (tree, s)
        expected.add(canonical(tree))
    assert {canonical(t) for t in trees} == expected


@pytest.mark.parametrize("k", range(1, 7))
def test_bushy_trees_count_and_uniqueness(k):
    names = tuple("ABCDEF"[:k])
    trees = P.bushy_trees(names)
    assert len(trees) == (double_factorial(2 * k - 3) if k > 1 else 1)
    assert len({canonical(t) for t in trees}) == len(trees)
    for t in trees:
        assert sorted(leaves(t)) == sorted(names)


def test_om_candidate_counts():
    # OM §5.2: a single-stream query with one selection and one projection has 2 candidate plans
    q1 = P.Query(streams=("TCP",), selections={"TCP": [P.Predicate(0.1)]}, projections={"TCP": 0.0})
    plans = P.enumerate_plans(q1)
    assert len(plans) == 2
    assert {P.render(p) for p in plans} == {"π(σ[0.1](TCP))", "σ[0.1](π(TCP))"}
    # OM §5.3: three streams joined in left-deep order: 3 candidate plans
    q2 = P.Query(streams=("TCP", "UDP", "SF"),
                 joins={("TCP", "UDP"): P.JoinPredicate(0.01), ("UDP", "SF"): P.JoinPredicate(0.02)})
    assert len(P.enumerate_plans(q2)) == 3
    # five streams: 60 left-deep and 105 bushy orders
    q5 = P.Query(streams=tuple("ABCDE"))
    assert len(P.enumerate_plans(q5)) == 60
    assert len(P.enumerate_plans(q5, shape="bushy")) == 105


def test_grouped_selections_and_orders():
    preds = [P.Predicate(0.5, cost=1.0, name="a>5"), P.Predicate(0.2, cost=2.0, name="a<10")]
    q = P.Query(streams=("S",), selections={"S": preds}, projections={"S": 0.5})
    grouped = P.unary_orders(q, "S")
    assert len(grouped) == 2
    sel = next(n for n in P.postorder(grouped[0]) if isinstance(n, P.Select))
    assert sel.selectivity == pytest.approx(0.1) and sel.cost == 3.0 and sel.predicate == "a>5 AND a<10"
    # ungrouped: every order of the two selections and the projection (Viglas & Naughton Fig. 1: 2 orders)
    assert len(P.unary_orders(q, "S", group_selections=False)) == 6
    q_fig1 = P.Query(streams=("I",), selections={"I": [P.Predicate(0.1, cost=0.02), P.Predicate(0.1)]})
    assert len(P.enumerate_plans(q_fig1, group_selections=False)) == 2


def test_enumeration_builds_joins_windows_aggregate():
    q = P.Query(streams=("A", "B", "C"), windows={"A": 10, "B": 20},
                joins={("A", "B"): P.JoinPredicate(0.1, arrival_cost=1.0, pair_cost=0.5),
                       ("C", "B"): P.JoinPredicate(0.2, arrival_cost=2.0),
                       ("A", "C"): P.JoinPredicate(0.5)},
                join_method="nested_loops", aggregate=P.AggregateSpec(groups=4, cost=1.0, granularity=5))
    plans = P.enumerate_plans(q)
    assert len(plans) == 3
    for plan in plans:
        assert isinstance(plan, P.Aggregate) and plan.groups == 4
        assert isinstance(plan.child, P.Granularity) and plan.child.granularity == 5
        top = plan.child.child
        assert isinstance(top, P.Join)
        # the top join joins one stream with the other two: two predicates, selectivities multiply
        assert top.selectivity == pytest.approx(math.prod(
            p.selectivity for pair, p in q.joins.items() if len(pair & frozenset(P.source_names(top.right))) == 1))
        windows = {n.child.name: n.size for n in P.postorder(plan) if isinstance(n, P.Window)}
        assert windows == {"A": 10, "B": 20}
    ab_first = next(p for p in plans if {P.source_names(p.child.child.left)} == {("A", "B")})
    low = ab_first.child.child.left
    assert (low.selectivity, low.method, low.left_cost, low.cost) == (0.1, "nested_loops", 1.0, 0.5)


def test_cartesian_products_can_be_excluded():
    q = P.Query(streams=("A", "B", "C"),
                joins={("A", "B"): P.JoinPredicate(0.1), ("B", "C"): P.JoinPredicate(0.1)})
    with_cp = P.enumerate_plans(q)
    cp = [p for p in with_cp if any(isinstance(n, P.Join) and n.method == "nested_loops" and n.selectivity == 1
                                    for n in P.postorder(p))]
    assert len(cp) == 1  # (A × C) ⋈ B
    assert len(P.enumerate_plans(q, allow_cartesian=False)) == 2
    assert len(P.enumerate_plans(q, shape="bushy", allow_cartesian=False)) == 2


def test_query_validation():
    with pytest.raises(ValueError, match="streams"):
        P.Query(streams=())
    with pytest.raises(TypeError, match="streams"):
        P.Query(streams="AB")
    with pytest.raises(ValueError, match="twice"):
        P.Query(streams=("A", "A"))
    with pytest.raises(ValueError, match="selections"):
        P.Query(streams=("A",), selections={"B": [P.Predicate(0.5)]})
    with pytest.raises(TypeError, match="selections"):
        P.Query(streams=("A",), selections={"A": [0.5]})
    with pytest.raises(ValueError, match="joins"):
        P.Query(streams=("A", "B"), joins={("A", "A"): P.JoinPredicate(0.5)})
    with pytest.raises(ValueError, match="joins"):
        P.Query(streams=("A", "B"), joins={("A", "B"): P.JoinPredicate(0.5), ("B", "A"): P.JoinPredicate(0.1)})
    with pytest.raises(ValueError, match="join_method"):
        P.Query(streams=("A",), join_method="sort_merge")
    with pytest.raises(ValueError, match="selectivity"):
        P.Predicate(0)
    with pytest.raises(ValueError, match="shape"):
        P.enumerate_plans(P.Query(streams=("A",)), shape="right_deep")
    with pytest.raises(ValueError, match="stream"):
        P.unary_orders(P.Query(streams=("A",)), "B")


def test_best_plan():
    plans = [P.Source("A"), P.Source("B"), P.Source("C")]
    score = {"A": 3.0, "B": 1.0, "C": 2.0}
    assert P.best_plan(plans, lambda p: score[p.name]) == (plans[1], 1.0)
    assert P.best_plan(plans, lambda p: score[p.name], maximize=True) == (plans[0], 3.0)
    with pytest.raises(TypeError, match="plans"):
        P.best_plan([], len)
    with pytest.raises(TypeError, match="score"):
        P.best_plan(plans, 3)
