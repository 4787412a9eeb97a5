"""The results page's style sheet and script (kvbench.report.html writes them inline)."""

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0 auto;
 max-width:1400px;padding:0 1.2rem 4rem;color:#1d2430;background:#fbfbfc;box-sizing:border-box}
h1{margin:1.2rem 0 .2rem}h2{margin-top:2.2rem;border-bottom:1px solid #d8dde6;padding-bottom:.2rem}
.lede,.note{color:#4a5565}.muted{color:#7a8494;font-weight:normal}.small{font-size:12px}
.scroll{overflow-x:auto;border:1px solid #e1e5ec;border-radius:6px;background:#fff}
nav#contents ul{columns:4;margin:.3rem 0 0}
table{border-collapse:collapse;width:100%}th,td{padding:.28rem .5rem;text-align:left;
 border-bottom:1px solid #eef0f4;vertical-align:top}thead th{position:sticky;top:0;
 background:#f1f4f8;z-index:1;vertical-align:bottom}table.sortable thead th{cursor:pointer;
 user-select:none}th .unit{display:block;font-weight:normal;color:#4a5565;font-size:12px}
th.asc::after{content:' ▲'}th.desc::after{content:' ▼'}td.num{text-align:right;
 white-space:nowrap;font-variant-numeric:tabular-nums}tr.front td{background:#fff8e1}
.star{color:#c77c00}td{overflow-wrap:break-word}code{overflow-wrap:anywhere}
a{color:#1f5fbf;text-decoration:none}a:hover{text-decoration:underline}
.verdict.held{color:#137333;font-weight:600}.verdict.failed{color:#c5221f;font-weight:600}
.verdict.missing{color:#b06000;font-weight:600}.verdict.unmet{color:#7a5c00;font-weight:600}
.verdict.worse{color:#c5221f;font-weight:600}.verdict.better{color:#137333;font-weight:600}
.verdict.not-separated{color:#4a5565;font-weight:600}.why{color:#4a5565}
fieldset{border:1px solid #d8dde6;border-radius:6px;margin:1rem 0 0;font-size:13px}fieldset label{
 margin-right:1rem;white-space:nowrap}
figure{display:inline-block;margin:.6rem;max-width:46%;vertical-align:top}
figure img{max-width:100%;border:1px solid #e1e5ec;background:#fff}
figcaption{color:#4a5565;font-size:12px}
.headlines{display:grid;grid-template-columns:repeat(4,minmax(0,1fr));gap:.6rem}
figure.headline{display:block;margin:0;max-width:none;background:#fff;border:1px solid #e1e5ec;
 border-radius:6px;padding:.5rem .6rem}figure.headline figcaption{font-size:11.5px;line-height:1.35;
 margin-bottom:.2rem}figure.headline figcaption b{color:#1d2430;font-size:13px}
svg.chart{display:block;width:100%;height:auto}svg.chart text{font-family:inherit}
svg .tick{font-size:9.5px;fill:#4a5565}svg .axis{font-size:10.5px;fill:#1d2430}
svg .point{font-size:9px;fill:#1d2430}svg .ref{font-size:10px;fill:#222}
ul.legend{list-style:none;margin:.2rem 0 0;padding:0;display:flex;flex-wrap:wrap;
 gap:0 .6rem;font-size:11px;color:#4a5565}ul.legend li{white-space:nowrap}
svg.key{vertical-align:-1px;margin-right:.25rem}
details{border-bottom:1px solid #eef0f4;padding:.2rem 0}details[open]{background:#fff}
details.paired{padding:.35rem 0}details.fold{margin:.4rem 0}
summary{cursor:pointer}table.facts th{width:12rem;background:none;position:static}
tr.hidden,tr.held-hidden{display:none}td.params{min-width:9rem;max-width:20rem}
td.methods{min-width:10rem}td:first-child{white-space:nowrap}td.why{min-width:20rem}
"""

# Sorting by a column (numbers by their exact value, in data-v), the family filter, the claims
# not held, and opening the case (or paired table) a link points to, with the folds around it.
SCRIPT = """
(function(){
function key(td){var v=td.getAttribute('data-v');if(v!==null&&v!==''){return [0,parseFloat(v)];}
 return [1,td.textContent.trim().toLowerCase()];}
function cmp(a,b){if(a[0]!==b[0])return a[0]-b[0];return a[1]<b[1]?-1:a[1]>b[1]?1:0;}
document.querySelectorAll('table.sortable').forEach(function(table){
 table.querySelectorAll('thead th').forEach(function(th,col){
  th.addEventListener('click',function(){
   var desc=th.classList.contains('asc');
   table.querySelectorAll('thead th').forEach(function(o){o.classList.remove('asc','desc');});
   th.classList.add(desc?'desc':'asc');
   var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
   rows.sort(function(a,b){var r=cmp(key(a.cells[col]),key(b.cells[col]));return desc?-r:r;});
   rows.forEach(function(r){body.appendChild(r);});});});});
function filter(){var shown={};
 document.querySelectorAll('input.family').forEach(function(b){shown[b.value]=b.checked;});
 document.querySelectorAll('tr[data-family]').forEach(function(r){
  r.classList.toggle('hidden',!shown[r.getAttribute('data-family')]);});}
document.querySelectorAll('input.family').forEach(function(b){b.addEventListener('change',filter);});
var all=document.getElementById('all-families');
if(all){all.addEventListener('click',function(){
 document.querySelectorAll('input.family').forEach(function(b){b.checked=true;});filter();});}
var notHeld=document.getElementById('claims-not-held');
if(notHeld){notHeld.addEventListener('change',function(){
 document.querySelectorAll('#claims tr[data-verdict]').forEach(function(r){
  r.classList.toggle('held-hidden',notHeld.checked&&r.getAttribute('data-verdict')==='held');});});}
function openCase(){var id=location.hash.slice(1),el=id&&document.getElementById(id);
 if(el&&el.tagName==='DETAILS'){
  for(var p=el;p;p=p.parentElement){if(p.tagName==='DETAILS'){p.open=true;}}
  el.scrollIntoView();}}
window.addEventListener('hashchange',openCase);openCase();
})();
"""
