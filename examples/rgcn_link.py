"""R-GCN with random-walk sorts, and a link predictor, on a small synthetic knowledge graph.

People live in cities and cities lie in countries. A relational basis has one matrix per
random-walk *sort*, a sequence of relations (the paper's structure embedding): with the sort
``located_in^-1.lives_in^-1`` a single ``sc.nn.RGCNConv`` layer reads each person's country
directly, while R-GCN's single relations reach only the person's city. Part 1 classifies people
by country (featureless nodes, most cities unseen in training); part 2 trains
``sc.kg.LinkPredictor`` (DistMult over an R-GCN encoder with that sort) to predict held-out
``citizen_of`` triples and ranks them with ``sc.kg.evaluate`` (filtered MRR, Hits@K).

    python examples/rgcn_link.py            # 400 people
    python examples/rgcn_link.py --quick    # 200 people, fewer epochs (what CI runs)
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F

import structconv as sc

NAMES = ["lives_in", "located_in", "citizen_of"]


def world(people: int, cities: int, countries: int = 5, seed: int = 0):
    """Triples (T, 3) rows (head, relation, tail) of the three relations, and each person's
    country. Entities: people, then cities, then countries."""
    g = torch.Generator().manual_seed(seed)
    city_of = torch.randint(cities, (people,), generator=g)
    country_of_city = torch.randint(countries, (cities,), generator=g)
    p, c = torch.arange(people), people + torch.arange(cities)
    k = people + cities + country_of_city
    country = country_of_city[city_of]
    triples = torch.cat([
        torch.stack([p, torch.zeros_like(p), people + city_of], 1),            # lives_in
        torch.stack([c, torch.ones_like(c), k], 1),                            # located_in
        torch.stack([p, torch.full_like(p, 2), people + cities + country], 1),  # citizen_of
    ])
    return triples, country, people + cities + countries


def node_graph(triples: torch.Tensor):
    """lives_in and located_in edges with their inverses: edge_index (2, E), edge_type (E,),
    and the four relation names (index = relation id)."""
    t = triples[triples[:, 1] < 2]
    h, r, tail = t[:, 0], t[:, 1], t[:, 2]
    ei = torch.stack([torch.cat([h, tail]), torch.cat([tail, h])])
    return ei, torch.cat([r, r + 2]), ["lives_in", "located_in", "lives_in^-1", "located_in^-1"]


def classify(triples, country, n: int, sorts, epochs: int) -> float:
    """Held-out accuracy of one featureless RGCNConv layer with ``sorts`` predicting people's
    countries (60 % of people train)."""
    ei, et, names = node_graph(triples)
    people = country.numel()
    torch.manual_seed(0)
    layer = sc.nn.RGCNConv(n, 5, 4, sorts=sorts, relations=names)
    opt = torch.optim.Adam(layer.parameters(), lr=0.05, weight_decay=5e-4)
    train = torch.rand(people, generator=torch.Generator().manual_seed(1)) < 0.6
    for _ in range(epochs):
        loss = F.cross_entropy(layer(None, ei, et)[:people][train], country[train])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = layer(None, ei, et)[:people].argmax(1)
    return (pred[~train] == country[~train]).float().mean().item()


def link_prediction(triples, n: int, epochs: int) -> None:
    """DistMult over an R-GCN encoder whose sorts include the person -> country path; the
    citizen_of triples of a fifth of the people are held out and ranked."""
    citizen = triples[:, 1] == 2
    held = citizen & (triples[:, 0] % 5 == 0)
    train, test = triples[~held], triples[held]
    R = len(NAMES)
    names = NAMES + [f"{r}^-1" for r in NAMES]
    sorts = names + ["located_in^-1.lives_in^-1"]
    torch.manual_seed(0)
    model = sc.kg.LinkPredictor(n, R, 32, "distmult", init_std=0.1, encoder_layers=1,
                                graph=sc.kg.inverse_graph(train, R), block=4, sorts=sorts,
                                relations=names, edge_dropout=0.0, self_dropout=0.0)
    sc.training.train_link(model, train, mode="1vsall", epochs=epochs, batch_size=128, lr=0.02)
    model.eval()
    with torch.no_grad():
        m = sc.kg.evaluate(model.score_tails, test, triples, n, R)
    print(f"link prediction, {len(test)} held-out citizen_of triples (both directions, "
          f"filtered): MRR {m['mrr']:.3f}  Hits@1 {m['hits@1']:.3f}  Hits@10 {m['hits@10']:.3f}")
    share = model.sort_contributions()[0]  # (layers, K): the one encoder layer
    top = sorted(zip(sorts, share.tolist()), key=lambda s: -s[1])[:3]
    print("the sorts whose terms weigh most in the encoder (Frobenius norm): "
          + ", ".join(f"{s} ({v:.1f})" for s, v in top))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller world, fewer epochs")
    args = p.parse_args(argv)
    people, epochs = (200, 40) if args.quick else (400, 100)
    triples, country, n = world(people, cities=people // 2)
    print(f"{n} entities, {len(triples)} triples, relations {', '.join(NAMES)}")
    single = classify(triples, country, n, ["lives_in^-1", "located_in^-1"], epochs)
    path = classify(triples, country, n,
                    ["lives_in^-1", "located_in^-1", "located_in^-1.lives_in^-1"], epochs)
    print(f"country of held-out people, one R-GCN layer, single relations: {single:.3f}")
    print(f"the same with the sort located_in^-1.lives_in^-1:             {path:.3f}")
    link_prediction(triples, n, epochs // 2)


if __name__ == "__main__":
    main()
