// Stacked bar charts on uPlot: one bar per group (an hour, a day, or a category), its parts
// stacked by a second grouping. Values are credits.
import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

export type Stack = { label: string; values: number[] };

const COLOURS = ["#2563eb", "#16a34a", "#d97706", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#525252"];

/// `x` are seconds since the epoch when `time`, else indexes into `labels`.
export function StackedChart({
  x,
  stacks,
  time,
  labels,
  height = 240,
  title,
}: {
  x: number[];
  stacks: Stack[];
  time: boolean;
  labels?: string[];
  height?: number;
  title: string;
}) {
  const box = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const element = box.current;
    if (!element) return;
    // The render's cost is a User Timing measure (`sandbase:chart`), read by the browser test.
    const started = performance.now();
    let measured = false;
    // Cumulative sums, drawn top series first so each lower one shows over it.
    const sums: number[][] = [];
    let running = x.map(() => 0);
    for (const stack of stacks) {
      running = running.map((value, i) => value + (stack.values[i] ?? 0));
      sums.push(running);
    }
    const bars = uPlot.paths.bars!({ size: [0.7, 60] });
    // uPlot draws series in order and each bar starts at zero: the tallest (the whole
    // stack) first, each lower part over it.
    const order = stacks.map((_, i) => i).reverse();
    const series: uPlot.Series[] = [{ label: time ? "When" : "Group" }];
    for (const i of order) {
      const colour = COLOURS[i % COLOURS.length];
      const values = stacks[i].values;
      series.push({
        label: stacks[i].label,
        stroke: colour,
        fill: colour,
        paths: bars,
        points: { show: false },
        value: (_u, _v, _s, index) => (index === null || index === undefined ? "—" : (values[index] ?? 0).toFixed(4)),
      });
    }
    const options: uPlot.Options = {
      title,
      width: Math.max(320, element.clientWidth),
      height,
      scales: { x: { time, range: (_u, min, max) => [min - 0.5 * step(x), max + 0.5 * step(x)] } },
      axes: [
        time ? {} : { values: (_u, ticks) => ticks.map((tick) => labels?.[tick] ?? "") },
        { label: "credits", size: 70, values: (_u, ticks) => ticks.map(tickLabel) },
      ],
      series,
      legend: { show: stacks.length > 0 },
      hooks: {
        draw: [
          () => {
            if (measured) return;
            measured = true;
            performance.measure("sandbase:chart", { start: started, detail: { points: x.length * stacks.length } });
          },
        ],
      },
    };
    const plot = new uPlot(options, [x, ...order.map((i) => sums[i])] as uPlot.AlignedData, element);
    const resize = () => plot.setSize({ width: Math.max(320, element.clientWidth), height });
    window.addEventListener("resize", resize);
    return () => {
      window.removeEventListener("resize", resize);
      plot.destroy();
    };
  }, [x, stacks, time, labels, height, title]);
  return <div class="chart" ref={box} role="img" aria-label={title} />;
}

function tickLabel(value: number): string {
  if (value === 0) return "0";
  return Math.abs(value) >= 1 ? value.toFixed(2).replace(/\.?0+$/, "") : value.toPrecision(2);
}

function step(x: number[]): number {
  return x.length > 1 ? (x[x.length - 1] - x[0]) / (x.length - 1) : 1;
}

/// Every day or hour from `from` to `to`, keyed as the API keys them.
export function buckets(from: Date, to: Date, unit: "day" | "hour"): string[] {
  const step = unit === "day" ? 86400_000 : 3600_000;
  const keys: string[] = [];
  for (let at = Math.floor(from.getTime() / step) * step; at < to.getTime() && keys.length < 20_000; at += step) {
    const iso = new Date(at).toISOString();
    keys.push(unit === "day" ? iso.slice(0, 10) : `${iso.slice(0, 13)}:00:00Z`);
  }
  return keys;
}

/// Rows of (group, split, amount) as chart input: groups in order (`all`, when given, are the
/// time buckets to show even when nothing was spent in them), one stack per split.
export function stack(
  rows: { key: string; split?: string | null; amount_micro: number }[],
  time: boolean,
  all: string[] = [],
): { x: number[]; labels: string[]; stacks: Stack[] } {
  const groups: string[] = [];
  const index = new Map<string, number>();
  for (const row of [...all.map((key) => ({ key })), ...rows]) {
    if (!index.has(row.key)) {
      index.set(row.key, groups.length);
      groups.push(row.key);
    }
  }
  if (time) groups.sort();
  groups.forEach((group, i) => index.set(group, i));
  const splits = new Map<string, number[]>();
  for (const row of rows) {
    const split = row.split ?? "spent";
    if (!splits.has(split)) splits.set(split, groups.map(() => 0));
    splits.get(split)![index.get(row.key)!] += row.amount_micro / 1_000_000;
  }
  const x = time ? groups.map((group) => Date.parse(group.length === 10 ? `${group}T00:00:00Z` : group) / 1000) : groups.map((_, i) => i);
  const stacks = [...splits.entries()]
    .map(([split, values]) => ({ label: split, values }))
    .sort((a, b) => sum(b.values) - sum(a.values));
  return { x, labels: groups, stacks };
}

function sum(values: number[]): number {
  return values.reduce((total, value) => total + value, 0);
}
