// charts.js - per-rank line charts (loss, tokens/s against step) drawn by
// uPlot, which index.html loads as the global `uPlot`. One series per rank;
// points arrive from GET .../metrics and then from progress events.

const COLORS = ['#2563eb', '#dc2626', '#059669', '#d97706', '#7c3aed', '#0891b2', '#db2777',
                '#65a30d'];
export const rankColor = (r) => COLORS[r % COLORS.length];

// Steps are whole numbers: the step axis ticks every 1, 2, 5, 10, 20, ...
// steps (uPlot's own choice for a short run would be 0.25 apart).
const STEP_INCRS = [];
for (let p = 1; p <= 1e9; p *= 10) STEP_INCRS.push(p, 2 * p, 5 * p);

export class RankChart {
  // host: the element to draw in; title: e.g. "loss"; fmt: value -> text.
  constructor(host, title, fmt) {
    this.host = host;
    this.title = title;
    this.fmt = fmt;
    this.ranks = [];          // rank numbers, in series order
    this.points = new Map();  // rank -> Map(step -> value)
    this.plot = null;
    this.dirty = false;
    this.resize = new ResizeObserver(() => this.fit());
    this.resize.observe(host);
  }

  // Adds (or replaces) the value of rank at step. Redraws on the next frame.
  add(rank, step, value) {
    if (value === null || value === undefined || !isFinite(value)) return;
    if (!this.points.has(rank)) this.points.set(rank, new Map());
    this.points.get(rank).set(step, value);
    if (!this.dirty) {
      this.dirty = true;
      requestAnimationFrame(() => this.draw());
    }
  }

  clear() {
    this.points.clear();
    this.draw();
  }

  // Number of points held for rank (for the tests' progress checks).
  count(rank) { return this.points.has(rank) ? this.points.get(rank).size : 0; }

  data() {
    const steps = new Set();
    for (const m of this.points.values()) for (const s of m.keys()) steps.add(s);
    const xs = [...steps].sort((a, b) => a - b);
    const ranks = [...this.points.keys()].sort((a, b) => a - b);
    return { ranks, table: [xs, ...ranks.map((r) => xs.map((s) => this.points.get(r).get(s) ?? null))] };
  }

  draw() {
    this.dirty = false;
    const { ranks, table } = this.data();
    if (!ranks.length) {
      if (this.plot) this.plot.destroy();
      this.plot = null;
      this.ranks = [];
      const empty = document.createElement('p');
      empty.className = 'muted small chart-empty';
      empty.textContent = this.title + ': no training steps yet';
      this.host.replaceChildren(empty);
      return;
    }
    const same = this.plot && ranks.length === this.ranks.length &&
                 ranks.every((r, i) => r === this.ranks[i]);
    if (same) {
      this.plot.setData(table);
      this.showLatest(this.plot);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.ranks = ranks;
    const fmt = this.fmt;
    const opts = {
      title: this.title,
      width: this.width(), height: 180,
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: false } },
      axes: [{ label: 'step', size: 36, labelSize: 14, incrs: STEP_INCRS },
             { size: 54, values: (u, vals) => vals.map((v) => fmt(v)) }],
      // Without the cursor over the chart, the legend shows the newest step.
      hooks: { setLegend: [(u) => { if (u.legend.idx == null) this.showLatest(u); }] },
      series: [{ label: 'step' },
               ...ranks.map((r) => ({ label: 'rank ' + r, stroke: rankColor(r), width: 1.5,
                                      spanGaps: true, value: (u, v) => (v === null ? '–' : fmt(v)),
                                      points: { show: false } }))],
    };
    this.host.replaceChildren();
    this.plot = new uPlot(opts, table, this.host);
    this.showLatest(this.plot);
  }

  // Each series' newest point in the legend (ranks may be a step apart).
  showLatest(u) {
    const n = u.data[0].length;
    if (!n || u.cursor.left >= 0) return;
    const idxs = u.data.map((col) => {
      let i = col.length - 1;
      while (i > 0 && col[i] === null) i--;
      return i;
    });
    u.setLegend({ idxs }, false);
  }

  width() { return Math.max(240, Math.floor(this.host.clientWidth || 300)); }

  fit() {
    if (this.plot) this.plot.setSize({ width: this.width(), height: 180 });
  }

  destroy() {
    this.resize.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}
