"""The demo's sample `shop` schema and its built-in workload generator (`sluice demo`).

The schema is chosen to reach what users' tables hold: non-ASCII text, DECIMALs, DATETIME(6), a
composite primary key whose rows change key, an update-heavy table; the probe table is what the
demo writes last and waits for in Spark.
"""
from __future__ import annotations

import decimal
import random
import threading
import time
from collections.abc import Callable
from typing import Any

SHOP = "shop"
PROBE_DB = "sluice_demo"


SCHEMA = [
    f"CREATE DATABASE IF NOT EXISTS {SHOP} CHARACTER SET utf8mb4",
    f"""CREATE TABLE {SHOP}.customers (
        id INT PRIMARY KEY, name VARCHAR(64) CHARACTER SET utf8mb4 NOT NULL,
        email VARCHAR(128), balance DECIMAL(12,2) NOT NULL DEFAULT 0,
        created DATETIME(6) NOT NULL, vip TINYINT NOT NULL DEFAULT 0)""",
    f"""CREATE TABLE {SHOP}.orders (
        id BIGINT PRIMARY KEY, customer_id INT NOT NULL, total DECIMAL(14,2) NOT NULL,
        status VARCHAR(16) NOT NULL, placed DATETIME(6) NOT NULL,
        note VARCHAR(200) CHARACTER SET utf8mb4)""",
    # A composite primary key, whose rows also change key (line renumbering).
    f"""CREATE TABLE {SHOP}.order_items (
        order_id BIGINT NOT NULL, line SMALLINT NOT NULL, sku VARCHAR(16) NOT NULL,
        qty INT NOT NULL, price DECIMAL(10,2) NOT NULL, PRIMARY KEY (order_id, line))""",
    # Update-heavy: every order moves stock.
    f"""CREATE TABLE {SHOP}.inventory (
        sku VARCHAR(16) PRIMARY KEY, stock INT NOT NULL, reserved INT NOT NULL DEFAULT 0,
        updated DATETIME(6) NOT NULL)""",
    f"CREATE DATABASE IF NOT EXISTS {PROBE_DB}",
    f"CREATE TABLE {PROBE_DB}.probe (id INT PRIMARY KEY, written DATETIME(6) NOT NULL)",
]

NAMES = ["Zoë Åström", "José Núñez", "Łukasz Żółć", "Søren Kierkegård", "Chloé Dubois",
         "Ærin Ødegård", "François Müller", "山田 太郎", "Мария Иванова", "Ngozi Okafor",
         "Aroha Ngata", "Dvořák Antonín", "O'Brien", "Ñandú Peña", "😀 Emoji Fan"]
NOTES = [None, "leave at the door", "fragile — handle with care", "gift wrap 🎁",
         "livraison rapide", "Zustellung nach 18 Uhr", "配達は午前中"]


class ShopGenerator:
    """Random shop transactions: new customers, orders with items, stock updates, cancellations
    (deletes), line renumbering (primary-key changes), balance changes."""

    def __init__(self, connect: Callable[[], Any], seed: int, customers: int, skus: int) -> None:
        self.connect = connect
        self.rng = random.Random(seed)
        self.customers = customers
        self.skus = [f"SKU-{i:05d}" for i in range(skus)]
        self.next_customer = customers + 1
        self.next_order = 1
        self.orders: list[int] = []
        self.committed = 0
        self.error: BaseException | None = None

    def now(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()) + f".{self.rng.randrange(10**6):06d}"

    def load(self) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {SHOP}.customers (id, name, email, balance, created) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    [(i, self.rng.choice(NAMES), f"user{i}@example.com",
                      decimal.Decimal(self.rng.randrange(0, 100000)) / 100, self.now())
                     for i in range(1, self.customers + 1)])
                cur.executemany(
                    f"INSERT INTO {SHOP}.inventory (sku, stock, updated) VALUES (%s, %s, %s)",
                    [(s, self.rng.randrange(100, 1000), self.now()) for s in self.skus])
            conn.commit()
        finally:
            conn.close()

    def run(self, stop: threading.Event) -> None:
        try:
            conn = self.connect()
            try:
                while not stop.is_set():
                    with conn.cursor() as cur:
                        self.transaction(cur)
                    conn.commit()
                    self.committed += 1
            finally:
                conn.close()
        except Exception as e:  # noqa: BLE001 - reported by the demo; the run still verifies
            self.error = e

    def transaction(self, cur: Any) -> None:
        r = self.rng.random()
        if r < 0.40 or not self.orders:
            self.place_order(cur)
        elif r < 0.55:
            sku = self.rng.choice(self.skus)
            cur.execute(f"UPDATE {SHOP}.inventory SET stock = stock + %s, updated = %s "
                        "WHERE sku = %s", (self.rng.randrange(1, 50), self.now(), sku))
        elif r < 0.65:
            oid = self.rng.choice(self.orders)
            cur.execute(f"UPDATE {SHOP}.orders SET status = %s, note = %s WHERE id = %s",
                        (self.rng.choice(["paid", "shipped", "delivered"]),
                         self.rng.choice(NOTES), oid))
        elif r < 0.72:
            # Renumber an order's lines: a primary-key change of the composite key.
            oid = self.rng.choice(self.orders)
            cur.execute(f"UPDATE {SHOP}.order_items SET line = line + 100 WHERE order_id = %s "
                        "ORDER BY line DESC", (oid,))
        elif r < 0.80:
            oid = self.orders.pop(self.rng.randrange(len(self.orders)))
            cur.execute(f"DELETE FROM {SHOP}.order_items WHERE order_id = %s", (oid,))
            cur.execute(f"DELETE FROM {SHOP}.orders WHERE id = %s", (oid,))
        elif r < 0.90:
            cid = self.rng.randrange(1, self.next_customer)
            cur.execute(f"UPDATE {SHOP}.customers SET balance = balance + %s, vip = %s "
                        "WHERE id = %s",
                        (decimal.Decimal(self.rng.randrange(-500, 5000)) / 100,
                         self.rng.randrange(2), cid))
        elif r < 0.96:
            cid = self.next_customer
            self.next_customer += 1
            cur.execute(f"INSERT INTO {SHOP}.customers (id, name, email, balance, created) "
                        "VALUES (%s, %s, %s, %s, %s)",
                        (cid, self.rng.choice(NAMES), None, decimal.Decimal("0.00"), self.now()))
        else:
            cid = self.rng.randrange(1, self.next_customer)
            cur.execute(f"DELETE FROM {SHOP}.customers WHERE id = %s AND id NOT IN "
                        f"(SELECT customer_id FROM {SHOP}.orders)", (cid,))

    def place_order(self, cur: Any) -> None:
        oid = self.next_order
        self.next_order += 1
        lines = [(oid, n + 1, self.rng.choice(self.skus), self.rng.randrange(1, 5),
                  decimal.Decimal(self.rng.randrange(99, 99999)) / 100)
                 for n in range(self.rng.randrange(1, 4))]
        total = sum((q * p for _, _, _, q, p in lines), decimal.Decimal(0))
        cur.execute(f"INSERT INTO {SHOP}.orders VALUES (%s, %s, %s, 'new', %s, %s)",
                    (oid, self.rng.randrange(1, self.next_customer), total, self.now(),
                     self.rng.choice(NOTES)))
        cur.executemany(f"INSERT INTO {SHOP}.order_items VALUES (%s, %s, %s, %s, %s)", lines)
        for _, _, sku, qty, _ in lines:
            cur.execute(f"UPDATE {SHOP}.inventory SET stock = stock - %s, reserved = reserved "
                        "+ %s, updated = %s WHERE sku = %s", (qty, qty, self.now(), sku))
        self.orders.append(oid)
