// Canopy web view. Reads /ui/api/* with the caller's bearer token (kept in sessionStorage, sent
// as an Authorization header, never put in a URL) and draws what the caller may see. All text
// from the index goes into the page as text nodes (d3 .text / textContent), never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "canopy-token";
  const TYPE_COLOURS = {
    organization: "#3b7dd8", person: "#e0793a", geo: "#3fa66b", event: "#b8549c",
  };
  const OTHER_COLOUR = "#8a8f8c";
  const LABELLED = 16;  // names drawn in a graph (the best-connected); the rest on hover
  const PALETTE = ["#4e79a7", "#f28e2c", "#59a14f", "#e15759", "#76b7b2", "#edc949",
                   "#af7aa1", "#ff9da7", "#9c755f", "#bab0ab"];

  const $ = (id) => document.getElementById(id);
  const state = { tree: null, top: null, root: null, byId: new Map(), focus: null,
                  selected: null, entity: null, zoomTo: null, loading: new Map() };

  // ---- the API ------------------------------------------------------------------------------

  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path, payload) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    const init = { headers, cache: "no-store", credentials: "omit" };
    if (payload !== undefined) {
      init.method = "POST";
      init.body = JSON.stringify(payload);
      headers["Content-Type"] = "application/json";
    }
    const response = await fetch(path, init);
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) {
      const message = (body && body.error) || response.statusText || "request failed";
      if (response.status === 401) askForToken(token ? "That token was not accepted." : "");
      throw new HttpError(response.status, message);
    }
    return body;
  }

  function askForToken(why) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("main").hidden = true;
    $("login").hidden = false;
    $("forget").hidden = true;
    $("login-error").textContent = why;
    $("token").focus();
    document.body.dataset.state = "login";
  }

  function showMessage(text) {
    $("message").hidden = !text;
    $("message").textContent = text || "";
  }

  // ---- the hierarchy, loaded as it is opened --------------------------------------------------

  // The page's own ?depth=N&limit=N go to the hierarchy's requests (lighter first answers).
  function treeQuery(extra) {
    const params = new URLSearchParams();
    const page = new URLSearchParams(location.search);
    for (const name of ["depth", "limit"]) {
      if (/^[0-9]+$/.test(page.get(name) || "")) params.set(name, page.get(name));
    }
    for (const [name, value] of Object.entries(extra)) params.set(name, String(value));
    // A page of sub-communities is asked for with them: at least one level below its root.
    if ("offset" in extra && params.get("depth") === "0") params.set("depth", "1");
    return "/ui/api/communities?" + params.toString();
  }

  // A community's page; the page's own ?limit=N bounds its list of sub-communities too.
  function communityQuery(id, extra) {
    const params = new URLSearchParams();
    const limit = new URLSearchParams(location.search).get("limit") || "";
    if (/^[0-9]+$/.test(limit)) params.set("limit", limit);
    for (const [name, value] of Object.entries(extra)) params.set(name, String(value));
    const query = params.toString();
    return "/ui/api/community/" + encodeURIComponent(id) + (query ? "?" + query : "");
  }

  // Each community of the tree (and the top, id null) holds the sub-communities loaded so far;
  // `next_offset` is where the rest start (null: all are here). One request at a time per node.
  function hasMore(data) { return data.next_offset !== null && data.next_offset !== undefined; }

  function loadMore(data) {
    const key = data.id === null ? "" : "c:" + data.id;
    if (!state.loading.has(key)) {
      const job = (async () => {
        const offset = data.next_offset;
        const extra = data.id === null ? { offset } : { root: data.id, offset };
        const got = await api(treeQuery(extra));
        const more = data.id === null
          ? { children: got.roots, next_offset: got.next_offset, children_count: got.roots_count }
          : got.roots[0];
        data.children = (data.children || []).slice(0, offset).concat(more.children);
        data.next_offset = more.next_offset;
        data.children_count = more.children_count;
      })().finally(() => state.loading.delete(key));
      state.loading.set(key, job);
    }
    return state.loading.get(key);
  }

  // Loads what showing community `id` needs: the chain to it from the top (`parents`, root
  // first, as its page names them) and its own sub-communities. True when the tree grew.
  async function reveal(id, parents) {
    let grew = false;
    let at = state.top;
    for (const cid of [...parents.map((p) => p.id), id]) {
      const child = () => (at.children || []).find((k) => k.id === cid);
      while (!child() && hasMore(at)) {
        const had = (at.children || []).length;
        await loadMore(at);
        grew = true;
        if ((at.children || []).length <= had) break;  // no progress: never loop
      }
      if (!child()) return grew;  // not under its parent here (the index changed)
      at = child();
    }
    if (hasMore(at) && !(at.children || []).length) { await loadMore(at); grew = true; }
    return grew;
  }

  // Draws the grown tree again, showing the open community as before (no animation).
  function redraw() {
    drawSunburst(state.top);
    const open = state.selected && state.byId.get(state.selected);
    state.zoomTo(open || null, false);
    state.highlight(state.selected);
  }

  // ---- start --------------------------------------------------------------------------------

  async function start() {
    showMessage("");
    let tree;
    try {
      tree = await api(treeQuery({}));
    } catch (e) {
      if (e.status !== 401) { showMessage(e.message); document.body.dataset.state = "error"; }
      return;
    }
    $("login").hidden = true;
    $("main").hidden = false;
    $("forget").hidden = !sessionStorage.getItem(TOKEN_KEY);
    $("index-name").textContent = tree.index;
    document.title = "Canopy · " + tree.index;
    $("stats").textContent = `${tree.communities} communities · ${tree.entities} entities`;
    $("who").textContent = tree.caller === null ? "all documents (no access policy)"
                                                : "viewing as " + tree.caller;
    state.tree = tree;
    state.top = { id: null, title: tree.index, size: tree.entities, children: tree.roots,
                  children_count: tree.roots_count, next_offset: tree.next_offset };
    drawSunburst(state.top);
    document.body.dataset.state = "ready";
    await route();
  }

  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token").value = "";
    start();
  });

  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.hash = "";
    askForToken("");
  });

  // The open community and entity live in the URL's fragment (#c=ID&e=ID): links and the back
  // button work, and the fragment is never sent to the server.
  function hashState() {
    const params = new URLSearchParams(location.hash.slice(1));
    return { c: params.get("c"), e: params.get("e") };
  }

  function go(c, e) {
    const params = new URLSearchParams();
    if (c) params.set("c", c);
    if (e) params.set("e", e);
    const next = "#" + params.toString();
    if (location.hash === next || (next === "#" && !location.hash)) route();
    else location.hash = next;
  }

  window.addEventListener("hashchange", route);

  async function route() {
    if (!state.tree) return;
    const { c, e } = hashState();
    const jobs = [];
    if (c !== state.selected) jobs.push(openCommunity(c));
    if (e !== state.entity) jobs.push(openEntity(e));
    await Promise.all(jobs);
  }

  // ---- the sunburst -------------------------------------------------------------------------

  function shortTitle(title) {
    // Report titles name the community's main entities ("A, B and C"): the first names it.
    return title.split(/,| and /)[0].trim();
  }

  function drawSunburst(data) {
    const width = 560;
    // The centre disc, then three rings (deeper ones appear when zoomed).
    const centreRadius = 66;
    const ring = (width / 2 - 4 - centreRadius) / 3;
    const rad = (y) => (y <= 0 ? 0 : centreRadius + (y - 1) * ring);
    const hierarchy = d3.hierarchy(data)
      // An arc's own share: members not in any visible sub-community.
      .sum((d) => Math.max(0, d.size - d3.sum(d.children || [], (k) => k.size)))
      .sort((a, b) => b.value - a.value || d3.ascending(a.data.id, b.data.id));
    const root = d3.partition().size([2 * Math.PI, hierarchy.height + 1])(hierarchy);
    state.byId = new Map();
    root.each((d) => { d.current = d; if (d.data.id) state.byId.set(d.data.id, d); });
    state.root = root;
    state.focus = root;
    const colour = new Map(root.children
      ? root.children.map((d, i) => [d.data.id, PALETTE[i % PALETTE.length]]) : []);
    const fill = (d) => {
      let top = d;
      while (top.depth > 1) top = top.parent;
      const base = d3.color(colour.get(top.data.id) || OTHER_COLOUR);
      return d3.interpolateRgb(base, "#ffffff")(Math.min(0.6, 0.2 * (d.depth - 1)));
    };

    const arc = d3.arc()
      .startAngle((d) => d.x0).endAngle((d) => d.x1)
      .padAngle((d) => Math.min((d.x1 - d.x0) / 2, 0.004)).padRadius(width / 4)
      .innerRadius((d) => rad(d.y0))
      .outerRadius((d) => Math.max(rad(d.y0), rad(d.y1) - 1));

    const svg = d3.select("#sunburst").attr("viewBox", [-width / 2, -width / 2, width, width]);
    svg.selectAll("*").remove();
    const g = svg.append("g");
    const path = g.append("g").selectAll("path")
      .data(root.descendants().slice(1))
      .join("path")
      .attr("fill", fill)
      .attr("fill-opacity", (d) => arcVisible(d.current) ? 1 : 0)
      .attr("pointer-events", (d) => arcVisible(d.current) ? "auto" : "none")
      .attr("d", (d) => arc(d.current))
      .attr("data-id", (d) => d.data.id)
      .on("click", (event, d) => go(d.data.id, null));
    path.append("title").text((d) => `${d.data.title}\n${d.data.size} entities · level ${d.data.level}`);

    const label = g.append("g").attr("text-anchor", "middle")
      .selectAll("text")
      .data(root.descendants().slice(1))
      .join("text")
      .attr("class", "arc-label")
      .attr("data-id", (d) => d.data.id)
      .attr("dy", "0.35em")
      .attr("fill-opacity", (d) => +labelVisible(d.current))
      .attr("transform", (d) => labelTransform(d.current))
      .text((d) => fitLabel(shortTitle(d.data.title), ring - 8));

    // The centre names the open community and rolls up one level when clicked.
    const centre = g.append("g").attr("class", "centre").on("click", () => {
      const open = state.selected && state.byId.get(state.selected);
      const up = open ? open.parent : null;
      go(up && up.data.id ? up.data.id : null, null);
    });
    centre.append("circle").attr("r", centreRadius - 2).attr("fill", "#f3f5f1");
    const centreText = centre.append("text").attr("text-anchor", "middle");

    function setCentre(open) {
      centreText.selectAll("*").remove();
      const lines = wrap(open ? open.data.title : data.title, 17).slice(0, 4);
      const top = -((lines.length + 1) * 14) / 2 + 8;
      lines.forEach((line, i) => centreText.append("tspan").attr("x", 0)
        .attr("y", top + i * 14).text(line));
      centreText.append("tspan").attr("class", "sub").attr("x", 0)
        .attr("y", top + lines.length * 14 + 4)
        .text(open ? "▲ up one level" : `${data.size} entities`);
    }
    setCentre(null);

    // Show the open community (`p`, or none) with as much context as three rings allow: the
    // view is rooted at the ancestor that still leaves room for p's sub-communities.
    state.zoomTo = (p, animate) => {
      setCentre(p && p.depth ? p : null);
      let focus = p || root;
      const depth = Math.max(0, focus.depth - (focus.children ? 2 : 3));
      while (focus.depth > depth) focus = focus.parent;
      listInside(p && p.children ? p : (p && p.parent) || root, fill);
      if (focus === state.focus) return;
      state.focus = focus;
      root.each((d) => {
        d.target = {
          x0: Math.max(0, Math.min(1, (d.x0 - focus.x0) / (focus.x1 - focus.x0))) * 2 * Math.PI,
          x1: Math.max(0, Math.min(1, (d.x1 - focus.x0) / (focus.x1 - focus.x0))) * 2 * Math.PI,
          y0: Math.max(0, d.y0 - focus.depth),
          y1: Math.max(0, d.y1 - focus.depth),
        };
      });
      const t = g.transition().duration(animate ? 600 : 0);
      path.transition(t)
        .tween("data", (d) => { const i = d3.interpolate(d.current, d.target);
                                return (k) => (d.current = i(k)); })
        .filter(function (d) { return +this.getAttribute("fill-opacity") || arcVisible(d.target); })
        .attr("fill-opacity", (d) => arcVisible(d.target) ? 1 : 0)
        .attr("pointer-events", (d) => arcVisible(d.target) ? "auto" : "none")
        .attrTween("d", (d) => () => arc(d.current));
      label.filter(function (d) { return +this.getAttribute("fill-opacity") || labelVisible(d.target); })
        .transition(t)
        .attr("fill-opacity", (d) => +labelVisible(d.target))
        .attrTween("transform", (d) => () => labelTransform(d.current));
    };
    listInside(root, fill);

    state.highlight = (id) => path.classed("selected", (d) => d.data.id === id);

    function arcVisible(d) { return d.y1 <= 4 && d.y0 >= 1 && d.x1 > d.x0; }
    function labelVisible(d) {
      return d.y1 <= 4 && d.y0 >= 1 && (d.y1 - d.y0) * (d.x1 - d.x0) > 0.1;
    }
    function labelTransform(d) {
      const x = (((d.x0 + d.x1) / 2) * 180) / Math.PI;
      const y = (rad(d.y0) + rad(d.y1)) / 2;
      return `rotate(${x - 90}) translate(${y},0) rotate(${x < 180 ? 0 : 180})`;
    }
  }

  function fitLabel(text, px) {
    const chars = Math.floor(px / 6.2);  // 10.5px sans-serif averages ~6 px a character
    return text.length <= chars ? text : text.slice(0, Math.max(1, chars - 1)) + "…";
  }

  function wrap(text, width) {
    const lines = [];
    let line = "";
    for (const word of text.split(/\s+/)) {
      if (line && (line + " " + word).length > width) { lines.push(line); line = word; }
      else line = line ? line + " " + word : word;
    }
    if (line) lines.push(line);
    return lines.map((l) => (l.length > width + 6 ? l.slice(0, width + 5) + "…" : l));
  }

  // The focused node's sub-communities with full titles: readable where arcs are small.
  function listInside(p, fill) {
    $("inside-title").textContent = p.data.id ? "Inside " + p.data.title
                                              : "Top-level communities";
    const items = d3.select("#inside").selectAll("li")
      .data(p.children || [], (d) => d.data.id)
      .join((enter) => {
        const li = enter.append("li");
        li.append("span").attr("class", "swatch");
        li.append("button").attr("type", "button").attr("class", "link");
        li.append("span").attr("class", "n");
        return li;
      });
    items.order();
    items.select(".swatch").style("background", (d) => fill(d));
    items.select(".link").text((d) => d.data.title)
      .on("click", (event, d) => go(d.data.id, null));
    items.select(".n").text((d) => d.data.size);
    // Sub-communities past the loaded ones: a button loads the next page of them.
    const more = $("inside-more");
    const left = (p.data.children_count || 0) - (p.data.children || []).length;
    more.hidden = !hasMore(p.data) || left <= 0;
    more.textContent = `Show more (${left} not drawn)`;
    more.onclick = async () => {
      more.disabled = true;
      try {
        await loadMore(p.data);
        redraw();
      } catch (e) {
        showMessage(e.message);
      } finally {
        more.disabled = false;
      }
    };
  }

  // ---- a community --------------------------------------------------------------------------

  async function openCommunity(id) {
    state.selected = id;
    const panel = d3.select("#community");
    if (state.highlight) state.highlight(id);
    if (!id) {
      panel.attr("data-id", null).selectAll("*").remove();
      panel.append("p").attr("class", "placeholder")
        .text("Pick a community in the sunburst to read its report and see its entity graph.");
      state.zoomTo(null, true);
      return;
    }
    let page;
    try {
      page = await api(communityQuery(id, {}));
    } catch (e) {
      if (state.selected !== id) return;
      panel.attr("data-id", null).selectAll("*").remove();
      panel.append("p").attr("class", "error").text(e.message);
      return;
    }
    if (state.selected !== id) return;  // another click came first
    // A community deeper than the tree loaded so far, or whose sub-communities were cut off:
    // load them (its page names its ancestors) and draw them before zooming in.
    let grew = false;
    try {
      grew = await reveal(id, page.parents);
    } catch (e) {
      showMessage(e.message);
    }
    if (state.selected !== id) return;
    if (grew) redraw();
    state.zoomTo(state.byId.get(id) || null, true);
    renderCommunity(panel, page);
    panel.attr("data-id", id);
  }

  function renderCommunity(panel, page) {
    panel.selectAll("*").remove();
    const c = page.community;
    if (page.parents.length) {
      const crumbs = panel.append("div").attr("class", "crumbs");
      page.parents.forEach((p) => {
        crumbs.append("button").attr("type", "button").attr("class", "link")
          .text(p.title).on("click", () => go(p.id, null));
        crumbs.append("span").text(" › ");
      });
    }
    panel.append("h2").text(c.title);
    const rating = c.rating === null ? "" : ` · rating ${c.rating.toFixed(1)}/10`;
    panel.append("p").attr("class", "meta")
      .text(`level ${c.level} · ${page.members} entities${rating} · ${c.id}`);

    panel.append("svg").attr("id", "graph").attr("role", "img")
      .attr("aria-label", "Entity graph of " + c.title);
    drawGraph(page);
    const types = [...new Set(page.nodes.map((n) => n.type))].sort();
    panel.append("div").attr("class", "legend").selectAll("span").data(types).join("span")
      .style("--c", (t) => TYPE_COLOURS[t] || OTHER_COLOUR).text((t) => t);
    if (page.members > page.nodes.length) {
      panel.append("p").attr("class", "meta")
        .text(`The ${page.nodes.length} best-connected of ${page.members} members are drawn.`);
    }

    panel.append("p").attr("class", "summary").text(c.summary);
    if (page.rating_explanation) {
      panel.append("p").attr("class", "meta").text(page.rating_explanation);
    }
    if (page.findings.length) {
      panel.append("h3").text("Findings");
      const li = panel.append("ol").attr("class", "findings").selectAll("li")
        .data(page.findings).join("li");
      li.append("b").text((f) => f.summary);
      li.append("p").text((f) => f.explanation);
    }
    if (page.children.length) {
      panel.append("h3").text("Sub-communities");
      listChildren(panel, page);
    }
  }

  // The community's sub-communities come in pages, as the tree's lists do: `next_offset` is
  // where the rest start, and "Show more" asks the community's page for the next part.
  function listChildren(panel, page) {
    const list = panel.append("ul").attr("class", "community-list").attr("id", "children");
    const more = panel.append("button").attr("type", "button").attr("class", "link")
      .attr("id", "children-more");
    const draw = () => {
      const items = list.selectAll("li").data(page.children, (k) => k.id)
        .join((enter) => {
          const li = enter.append("li");
          li.append("button").attr("type", "button").attr("class", "link");
          li.append("span").attr("class", "n");
          return li;
        });
      items.order();
      items.select(".link").text((k) => k.title).on("click", (event, k) => go(k.id, null));
      items.select(".n").text((k) => k.size);
      const left = page.children_count - page.children.length;
      more.property("hidden", !hasMore(page) || left <= 0)
        .text(`Show more (${left} not listed)`);
    };
    draw();
    more.on("click", async () => {
      const id = page.community.id;
      const offset = page.next_offset;
      more.property("disabled", true);
      try {
        const got = await api(communityQuery(id, { offset }));
        if (state.selected !== id) return;  // another community was opened meanwhile
        page.children = page.children.slice(0, offset).concat(got.children);
        page.children_count = got.children_count;
        page.next_offset = got.next_offset;
        draw();
      } catch (e) {
        showMessage(e.message);
      } finally {
        more.property("disabled", false);
      }
    });
  }

  function drawGraph(page) {
    const svg = d3.select("#graph");
    const box = svg.node().getBoundingClientRect();
    const width = Math.max(320, box.width || 480);
    const height = Math.max(240, box.height || 340);
    svg.attr("viewBox", [0, 0, width, height]);
    const nodes = page.nodes.map((n) => ({ ...n }));
    const links = page.edges.map((e) => ({ ...e }));
    const maxDegree = d3.max(nodes, (n) => n.degree) || 1;
    const r = d3.scaleSqrt().domain([0, maxDegree]).range([4, 13]);
    const w = d3.scaleLinear().domain([0, d3.max(links, (l) => l.weight) || 1]).range([0.8, 4]);
    // A fixed number of ticks before drawing: the same layout on every load (d3-force seeds
    // its own random source), and no animation to wait for.
    const sim = d3.forceSimulation(nodes)
      .force("link", d3.forceLink(links).id((d) => d.id).distance(90).strength(0.2))
      .force("charge", d3.forceManyBody().strength(-420))
      .force("x", d3.forceX(width / 2).strength(0.07))
      .force("y", d3.forceY(height / 2).strength(0.1))
      .force("collide", d3.forceCollide().radius((d) => r(d.degree) + 6))
      .stop();
    for (let i = 0; i < 300; i += 1) sim.tick();
    const pad = 16;
    const clamp = () => nodes.forEach((n) => {
      n.x = Math.max(pad, Math.min(width - pad, n.x));
      n.y = Math.max(pad, Math.min(height - pad, n.y));
    });
    clamp();

    const line = svg.append("g").selectAll("line").data(links).join("line")
      .attr("stroke-width", (l) => w(l.weight));
    line.append("title").text((l) => l.description);
    const labelled = new Set(nodes.slice().sort((a, b) => b.degree - a.degree)
      .slice(0, LABELLED).map((n) => n.id));
    const circle = svg.append("g").selectAll("circle").data(nodes).join("circle")
      .attr("r", (n) => r(n.degree))
      .attr("fill", (n) => TYPE_COLOURS[n.type] || OTHER_COLOUR)
      .attr("data-id", (n) => n.id)
      .classed("selected", (n) => n.id === state.entity)
      .on("click", (event, n) => go(state.selected, n.id));
    circle.append("title").text((n) => `${n.name} (${n.type}, ${n.degree} relationships)`);
    const text = svg.append("g").selectAll("text").data(nodes.filter((n) => labelled.has(n.id)))
      .join("text").attr("dy", "0.35em").text((n) => fitLabel(n.name, 130));

    function place() {
      line.attr("x1", (l) => l.source.x).attr("y1", (l) => l.source.y)
        .attr("x2", (l) => l.target.x).attr("y2", (l) => l.target.y);
      circle.attr("cx", (n) => n.x).attr("cy", (n) => n.y);
      // A label goes left of its node where it would run past the right edge.
      text.each(function (n) {
        const left = n.x + r(n.degree) + 4 + this.getComputedTextLength() > width - 4;
        d3.select(this).attr("x", n.x + (left ? -1 : 1) * (r(n.degree) + 4))
          .attr("text-anchor", left ? "end" : "start").attr("y", n.y);
      });
    }
    place();
    sim.on("tick", () => { clamp(); place(); });
    circle.call(d3.drag()
      .on("start", (event, n) => { if (!event.active) sim.alphaTarget(0.2).restart();
                                   n.fx = n.x; n.fy = n.y; })
      .on("drag", (event, n) => { n.fx = event.x; n.fy = event.y; })
      .on("end", (event, n) => { if (!event.active) sim.alphaTarget(0);
                                 n.fx = null; n.fy = null; }));
  }

  // ---- an entity ----------------------------------------------------------------------------

  async function openEntity(id) {
    state.entity = id;
    d3.selectAll("#graph circle").classed("selected", (n) => n.id === id);
    const panel = d3.select("#entity");
    if (!id) {
      panel.attr("data-id", null).selectAll("*").remove();
      panel.append("p").attr("class", "placeholder")
        .text("Click an entity in the graph to read its description and the passages it "
              + "comes from.");
      return;
    }
    let page;
    try {
      page = await api("/ui/api/entity/" + encodeURIComponent(id));
    } catch (e) {
      if (state.entity !== id) return;
      panel.attr("data-id", null).selectAll("*").remove();
      panel.append("p").attr("class", "error").text(e.message);
      return;
    }
    if (state.entity !== id) return;
    renderEntity(panel, page);
    panel.attr("data-id", id);
  }

  function renderEntity(panel, page) {
    panel.selectAll("*").remove();
    const e = page.entity;
    panel.append("h2").text(e.name);
    const meta = panel.append("p").attr("class", "meta");
    meta.append("span").attr("class", "chip")
      .style("color", TYPE_COLOURS[e.type] || OTHER_COLOUR).text(e.type);
    meta.append("span").text(`${page.n_relationships} relationships · ${page.n_sources} passages`);
    if (page.communities.length) {
      const crumbs = panel.append("div").attr("class", "crumbs");
      crumbs.append("span").text("In ");
      page.communities.forEach((c, i) => {
        if (i) crumbs.append("span").text(" › ");
        crumbs.append("button").attr("type", "button").attr("class", "link")
          .text(c.title).on("click", () => go(c.id, e.id));
      });
    }
    panel.append("p").attr("class", "summary").text(e.description);

    if (page.relationships.length) {
      panel.append("h3").text("Relationships");
      const li = panel.append("ul").attr("class", "relations").selectAll("li")
        .data(page.relationships).join("li");
      li.append("button").attr("type", "button").attr("class", "link").text((r) => r.entity)
        .on("click", (event, r) => go(state.selected, r.entity_id));
      li.append("p").attr("title", (r) => r.description).text((r) => r.description);
    }
    if (page.sources.length) {
      const more = page.n_sources > page.sources.length
        ? ` (${page.sources.length} of ${page.n_sources})` : "";
      panel.append("h3").text("Source passages" + more);
      page.sources.forEach((s) => {
        const div = panel.append("div").attr("class", "source");
        div.append("div").attr("class", "doc")
          .text(`${s.document} · characters ${s.char_start}–${s.char_end}`);
        const quote = div.append("blockquote").node();
        let at = 0;
        for (const [a, b] of s.marks) {
          quote.append(document.createTextNode(s.text.slice(at, a)));
          const mark = document.createElement("mark");
          mark.textContent = s.text.slice(a, b);
          quote.append(mark);
          at = b;
        }
        quote.append(document.createTextNode(s.text.slice(at)));
      });
    }
  }

  // ---- the query box: an answer with its router's choice and clickable citations -------------

  const ENGINES = { basic: "basic_search", local: "local_search", global: "global_search",
                    drift: "drift_search" };

  $("ask-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const query = $("question").value.trim();
    if (!query) return;
    const mode = $("mode").value;
    const box = $("answer");
    box.hidden = false;
    box.dataset.state = "asking";
    $("route").textContent = "Asking…";
    $("answer-text").textContent = "";
    $("citations").replaceChildren();
    $("passage").hidden = true;
    let result;
    try {
      result = await api("/ui/api/ask", { query, mode });
    } catch (e) {
      $("route").textContent = "";
      $("answer-text").textContent = e.message;
      box.dataset.state = "error";
      return;
    }
    renderAnswer(result);
    box.dataset.state = "answered";
  });

  function renderAnswer(result) {
    const r = result.route;
    const how = result.usage.provider === "builtin" ? "extractive answer (no LLM)"
                                                    : result.usage.provider;
    $("route").textContent = r
      ? `Routed to ${ENGINES[r.engine] || r.engine} by ${r.by === "llm" ? "the LLM" : "rules"}: `
        + `${r.reason} · ${how}`
      : `${ENGINES[result.method] || result.method} · ${how}`;
    $("answer-text").textContent = result.answer;
    const list = d3.select("#citations");
    list.selectAll("*").remove();
    const li = list.selectAll("li").data(result.citations).join("li")
      .attr("data-kind", (c) => c.kind).attr("data-id", (c) => c.id);
    li.append("span").attr("class", "chip").text((c) => c.kind.replace("_", " "));
    li.append("button").attr("type", "button").attr("class", "link")
      .text((c) => c.document || c.title || c.id)
      .on("click", (event, c) => openCitation(c));
    if (result.truncated && result.note) {
      list.append("li").attr("class", "hint").text(result.note);
    }
  }

  async function openCitation(c) {
    if (c.kind === "report") { go(c.id, null); return; }
    if (c.kind === "entity") { go(state.selected, c.id); return; }
    if (c.kind !== "text_unit") return;  // relationships and claims show in their community
    const box = $("passage");
    box.hidden = false;
    box.dataset.id = c.id;
    box.replaceChildren();
    let span;
    try {
      span = await api("/ui/api/unit/" + encodeURIComponent(c.id));
    } catch (e) {
      box.textContent = e.message;
      return;
    }
    if (box.dataset.id !== c.id) return;
    const doc = document.createElement("div");
    doc.className = "doc";
    doc.textContent = `${span.document} · characters ${span.char_start}–${span.char_end}`;
    const quote = document.createElement("blockquote");
    quote.textContent = span.text;
    box.replaceChildren(doc, quote);
  }

  // ---- entity search in the graph explorer ---------------------------------------------------

  $("entity-search").addEventListener("submit", async (event) => {
    event.preventDefault();
    const query = $("entity-query").value.trim();
    const list = d3.select("#entity-matches");
    list.selectAll("*").remove();
    if (!query) return;
    let found;
    try {
      found = await api("/ui/api/entities?q=" + encodeURIComponent(query));
    } catch (e) {
      list.append("li").attr("class", "error").text(e.message);
      return;
    }
    if (!found.entities.length) {
      list.append("li").attr("class", "hint").text(`No entity you can see is named like "${query}".`);
    }
    const li = list.selectAll("li.match").data(found.entities).join("li").attr("class", "match");
    li.append("button").attr("type", "button").attr("class", "link").attr("data-id", (n) => n.id)
      .text((n) => n.name).on("click", (event, n) => go(state.selected, n.id));
    li.append("span").attr("class", "meta")
      .text((n) => ` ${n.type} · ${n.degree} relationships`);
    $("entity-search").dataset.state = "found";
  });

  start();
})();
