import sys
sys.argv = ["x", "shape"]
exec(open("/work/coral-cache/loo.py").read().split("print(len(names)")[0])
print(len(names))
for c in acts:
    run(c, show=False)
