package main

// The argocd-redis role: Argo CD's application-state cache, as Argo CD v3.5 builds it
// (util/cache/cache.go buildRedisClient, util/cache/redis.go redisCache, util/cache/appstate),
// on the libraries Argo CD v3.5.7 pins: github.com/redis/go-redis/v9 v9.20.1 and
// github.com/go-redis/cache/v9 v9.0.0. One client plays Argo CD's server (on the hub, through
// the principal's Redis proxy), the other Argo CD's application controller (on an agent's own
// Redis).
//
//	argocd-gopeer argocd-redis --server-redis 127.0.0.1:PORT [--controller-redis 127.0.0.1:PORT]
//
// Commands (JSON lines; "as" is "server" or "controller"):
//
//	{"cmd":"set_tree","as":..,"app":"guestbook","tree":{..},"shard_size":N}  SetAppResourcesTree
//	{"cmd":"get_tree","as":..,"app":"agent-m_guestbook"}                     GetAppResourcesTree
//	{"cmd":"set_managed","as":..,"app":..,"managed":[..]}                    SetAppManagedResources
//	{"cmd":"get_managed","as":..,"app":..}                                   GetAppManagedResources
//	{"cmd":"set_item","as":..,"key":"mfst|..","value":<json>}                Cache.SetItem
//	{"cmd":"get_item","as":..,"key":"mfst|.."}                               Cache.GetItem
//	{"cmd":"watch","as":..,"app":..}   OnAppResourcesTreeChanged: reports tree_changed per message
//	{"cmd":"time_get_tree","as":..,"app":..,"n":200}  p50/p99 of n sequential GetAppResourcesTree

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	rediscache "github.com/go-redis/cache/v9"
	"github.com/redis/go-redis/v9"
)

// argoCacheVersion is Argo CD's common.CacheVersion, appended to every key.
const argoCacheVersion = "1.8.3"

// Argo CD's defaults: REDIS_RETRY_COUNT 3, --app-state-cache-expiration 1h.
const (
	argoRedisRetries     = 3
	argoAppStateDuration = time.Hour
)

// The JSON shapes of Argo CD's v1alpha1 types the cache holds (field names and omitempty as
// upstream's struct tags).
type argoResourceRef struct {
	Group     string `json:"group,omitempty"`
	Version   string `json:"version,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	UID       string `json:"uid,omitempty"`
}

type argoInfoItem struct {
	Name  string `json:"name,omitempty"`
	Value string `json:"value,omitempty"`
}

type argoHealth struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

type argoResourceNode struct {
	argoResourceRef `json:",inline"`
	ParentRefs      []argoResourceRef `json:"parentRefs,omitempty"`
	Info            []argoInfoItem    `json:"info,omitempty"`
	NetworkingInfo  json.RawMessage   `json:"networkingInfo,omitempty"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Images          []string          `json:"images,omitempty"`
	Health          *argoHealth       `json:"health,omitempty"`
	CreatedAt       *time.Time        `json:"createdAt,omitempty"`
}

type argoApplicationTree struct {
	Nodes         []argoResourceNode `json:"nodes,omitempty"`
	OrphanedNodes []argoResourceNode `json:"orphanedNodes,omitempty"`
	Hosts         []json.RawMessage  `json:"hosts,omitempty"`
	ShardsCount   int64              `json:"shardsCount,omitempty"`
}

type argoResourceDiff struct {
	Group               string `json:"group,omitempty"`
	Kind                string `json:"kind,omitempty"`
	Namespace           string `json:"namespace,omitempty"`
	Name                string `json:"name,omitempty"`
	TargetState         string `json:"targetState,omitempty"`
	LiveState           string `json:"liveState,omitempty"`
	Diff                string `json:"diff,omitempty"`
	Hook                bool   `json:"hook,omitempty"`
	NormalizedLiveState string `json:"normalizedLiveState,omitempty"`
	PredictedLiveState  string `json:"predictedLiveState,omitempty"`
	ResourceVersion     string `json:"resourceVersion,omitempty"`
	Modified            bool   `json:"modified,omitempty"`
}

// getShards is ApplicationTree.GetShards: nodes, then orphaned nodes, then hosts, `size` items
// a shard; the first shard carries the count. 0: one shard.
func (t *argoApplicationTree) getShards(size int64) []*argoApplicationTree {
	if size == 0 {
		return []*argoApplicationTree{t}
	}
	var items []func(*argoApplicationTree)
	for i := range t.Nodes {
		items = append(items, func(s *argoApplicationTree) { s.Nodes = append(s.Nodes, t.Nodes[i]) })
	}
	for i := range t.OrphanedNodes {
		items = append(items, func(s *argoApplicationTree) { s.OrphanedNodes = append(s.OrphanedNodes, t.OrphanedNodes[i]) })
	}
	for i := range t.Hosts {
		items = append(items, func(s *argoApplicationTree) { s.Hosts = append(s.Hosts, t.Hosts[i]) })
	}
	var shards []*argoApplicationTree
	for len(items) > 0 {
		shard := &argoApplicationTree{}
		shards = append(shards, shard)
		n := 0
		for i := int64(0); i < size && i < int64(len(items)); i++ {
			items[i](shard)
			n++
		}
		items = items[n:]
	}
	if len(shards) > 0 {
		shards[0].ShardsCount = int64(len(shards))
	}
	return shards
}

// merge is ApplicationTree.Merge.
func (t *argoApplicationTree) merge(other *argoApplicationTree) {
	t.Nodes = append(t.Nodes, other.Nodes...)
	t.OrphanedNodes = append(t.OrphanedNodes, other.OrphanedNodes...)
	t.Hosts = append(t.Hosts, other.Hosts...)
}

// argoCache is redisCache (gzip, Argo CD's default --redis-compress) under cacheutil.Cache.
type argoCache struct {
	client *redis.Client
	cache  *rediscache.Cache
}

func newArgoCache(addr string) *argoCache {
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: argoRedisRetries})
	return &argoCache{client: client, cache: rediscache.New(&rediscache.Options{Redis: client})}
}

// fullKey: cacheutil.Cache.generateFullKey.
func fullKey(key string) string { return key + "|" + argoCacheVersion }

// redisKey: redisCache.getKey with gzip.
func redisKey(key string) string { return fullKey(key) + ".gz" }

func (c *argoCache) setItem(key string, obj any) (int, error) {
	buf := &bytes.Buffer{}
	zw := gzip.NewWriter(buf)
	if err := json.NewEncoder(zw).Encode(obj); err != nil {
		return 0, err
	}
	// As upstream: Flush, not Close (the stream has no gzip trailer).
	if err := zw.Flush(); err != nil {
		return 0, err
	}
	err := c.cache.Set(&rediscache.Item{Key: redisKey(key), Value: buf.Bytes(), TTL: argoAppStateDuration})
	return buf.Len(), err
}

var errArgoCacheMiss = errors.New("cache: key is missing")

func (c *argoCache) getItem(key string, obj any) (int, error) {
	var data []byte
	err := c.cache.Get(context.Background(), redisKey(key), &data)
	if errors.Is(err, rediscache.ErrCacheMiss) {
		return 0, errArgoCacheMiss
	}
	if err != nil {
		return 0, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return len(data), err
	}
	if err := json.NewDecoder(zr).Decode(obj); err != nil {
		return len(data), fmt.Errorf("failed to decode cached data: %w", err)
	}
	return len(data), nil
}

func managedKey(app string) string { return "app|managed-resources|" + app }

func treeKey(app string, shard int64) string {
	key := "app|resources-tree|" + app
	if shard > 0 {
		key = fmt.Sprintf("%s|%d", key, shard)
	}
	return key
}

// getTree is appstate.Cache.GetAppResourcesTree; also the bytes read.
func (c *argoCache) getTree(app string) (*argoApplicationTree, int, error) {
	res := &argoApplicationTree{}
	total, err := c.getItem(treeKey(app, 0), res)
	if err != nil {
		return nil, total, err
	}
	for i := int64(1); i < res.ShardsCount; i++ {
		var shard argoApplicationTree
		n, err := c.getItem(treeKey(app, i), &shard)
		total += n
		if err != nil {
			return nil, total, fmt.Errorf("shard %d: %w", i, err)
		}
		res.merge(&shard)
	}
	return res, total, nil
}

type argoRedisCommand struct {
	Cmd       string          `json:"cmd"`
	ID        string          `json:"id"`
	As        string          `json:"as"`
	App       string          `json:"app"`
	Key       string          `json:"key"`
	Tree      json.RawMessage `json:"tree"`
	ShardSize int64           `json:"shard_size"`
	Managed   json.RawMessage `json:"managed"`
	Value     json.RawMessage `json:"value"`
	N         int             `json:"n"`
}

func runArgoCDRedis(args []string) error {
	fs := flag.NewFlagSet("argocd-redis", flag.ContinueOnError)
	serverAddr := fs.String("server-redis", "", "the Redis Argo CD's server uses (the principal's Redis proxy)")
	controllerAddr := fs.String("controller-redis", "", "the Redis the agent's application controller uses")
	if err := fs.Parse(args); err != nil {
		return err
	}
	caches := map[string]*argoCache{}
	if *serverAddr != "" {
		caches["server"] = newArgoCache(*serverAddr)
	}
	if *controllerAddr != "" {
		caches["controller"] = newArgoCache(*controllerAddr)
	}
	defer func() {
		for _, c := range caches {
			_ = c.client.Close()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var watches sync.WaitGroup
	defer watches.Wait()
	defer cancel()
	out.report(map[string]any{"kind": "ready"})

	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var c argoRedisCommand
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			out.report(map[string]any{"kind": "command_error", "error": fmt.Sprintf("bad command: %v", err)})
			continue
		}
		if c.Cmd == "quit" {
			return nil
		}
		cache, ok := caches[c.As]
		if !ok {
			out.report(map[string]any{"kind": "command_error", "cmd_id": c.ID, "error": fmt.Sprintf("no %q client", c.As)})
			continue
		}
		if c.Cmd == "watch" {
			watches.Add(1)
			go func() {
				defer watches.Done()
				watchTree(ctx, cache, c)
			}()
			out.report(map[string]any{"kind": "watching", "cmd_id": c.ID})
			continue
		}
		answer, err := argoRedisHandle(cache, c)
		if err != nil {
			out.report(map[string]any{"kind": "command_error", "cmd_id": c.ID, "cmd": c.Cmd, "error": err.Error()})
			continue
		}
		answer["cmd_id"] = c.ID
		out.report(answer)
	}
	return nil
}

// watchTree is appstate.Cache.OnAppResourcesTreeChanged as Argo CD's server runs it for a
// watched Application (redisCache.OnUpdated: Subscribe, then one callback per message), with
// the callback reading the tree again as the server's getAppResources does.
func watchTree(ctx context.Context, cache *argoCache, c argoRedisCommand) {
	channel := fullKey(managedKey(c.App))
	pubsub := cache.client.Subscribe(ctx, channel)
	defer pubsub.Close()
	ch := pubsub.Channel()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				out.report(map[string]any{"kind": "watch_ended", "cmd_id": c.ID})
				return
			}
			n++
			report := map[string]any{"kind": "tree_changed", "cmd_id": c.ID, "n": n, "channel": msg.Channel, "payload": msg.Payload}
			if tree, _, err := cache.getTree(c.App); err != nil {
				report["error"] = err.Error()
			} else {
				report["nodes"] = len(tree.Nodes)
			}
			out.report(report)
		}
	}
}

func argoRedisHandle(cache *argoCache, c argoRedisCommand) (map[string]any, error) {
	switch c.Cmd {
	case "set_tree":
		var tree argoApplicationTree
		if err := json.Unmarshal(c.Tree, &tree); err != nil {
			return nil, err
		}
		var keys []string
		var sizes []int
		for i, shard := range tree.getShards(c.ShardSize) {
			n, err := cache.setItem(treeKey(c.App, int64(i)), shard)
			if err != nil {
				return nil, err
			}
			keys = append(keys, redisKey(treeKey(c.App, int64(i))))
			sizes = append(sizes, n)
		}
		// NotifyUpdated: an empty message on the managed-resources key (no ".gz").
		receivers, err := cache.client.Publish(context.Background(), fullKey(managedKey(c.App)), "").Result()
		if err != nil {
			return nil, err
		}
		return map[string]any{"kind": "tree_set", "keys": keys, "bytes": sizes, "receivers": receivers}, nil
	case "get_tree":
		started := time.Now()
		tree, n, err := cache.getTree(c.App)
		took := time.Since(started)
		if errors.Is(err, errArgoCacheMiss) {
			return map[string]any{"kind": "tree", "miss": true, "error": err.Error()}, nil
		}
		if err != nil {
			return nil, err
		}
		return map[string]any{"kind": "tree", "miss": false, "tree": tree, "bytes": n, "micros": took.Microseconds()}, nil
	case "set_managed":
		var managed []*argoResourceDiff
		if err := json.Unmarshal(c.Managed, &managed); err != nil {
			return nil, err
		}
		sort.Slice(managed, func(i, j int) bool {
			return managedFullName(managed[i]) < managedFullName(managed[j])
		})
		n, err := cache.setItem(managedKey(c.App), managed)
		if err != nil {
			return nil, err
		}
		return map[string]any{"kind": "managed_set", "key": redisKey(managedKey(c.App)), "bytes": n}, nil
	case "get_managed":
		var managed []*argoResourceDiff
		n, err := cache.getItem(managedKey(c.App), &managed)
		if errors.Is(err, errArgoCacheMiss) {
			return map[string]any{"kind": "managed", "miss": true, "error": err.Error()}, nil
		}
		if err != nil {
			return nil, err
		}
		return map[string]any{"kind": "managed", "miss": false, "managed": managed, "bytes": n}, nil
	case "set_item":
		n, err := cache.setItem(c.Key, c.Value)
		if err != nil {
			return nil, err
		}
		return map[string]any{"kind": "item_set", "key": redisKey(c.Key), "bytes": n}, nil
	case "get_item":
		var value json.RawMessage
		_, err := cache.getItem(c.Key, &value)
		if errors.Is(err, errArgoCacheMiss) {
			return map[string]any{"kind": "item", "miss": true}, nil
		}
		if err != nil {
			return nil, err
		}
		return map[string]any{"kind": "item", "miss": false, "value": value}, nil
	case "time_get_tree":
		if c.N <= 0 {
			c.N = 100
		}
		took := make([]time.Duration, 0, c.N)
		for i := 0; i < c.N; i++ {
			started := time.Now()
			if _, _, err := cache.getTree(c.App); err != nil {
				return nil, err
			}
			took = append(took, time.Since(started))
		}
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		return map[string]any{
			"kind": "timing", "n": c.N,
			"p50_micros": took[len(took)/2].Microseconds(), "p99_micros": took[len(took)*99/100].Microseconds(),
		}, nil
	}
	return nil, fmt.Errorf("unknown command %q", c.Cmd)
}

// managedFullName is ResourceDiff.FullName.
func managedFullName(r *argoResourceDiff) string {
	return fmt.Sprintf("%s/%s/%s/%s", r.Group, r.Kind, r.Namespace, r.Name)
}
